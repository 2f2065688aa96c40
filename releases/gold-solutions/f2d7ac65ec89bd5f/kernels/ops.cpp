#include "registry.h"

std::vector<torch::Tensor> add_pool_conv_ln_pool(torch::Tensor x, torch::Tensor y, torch::Tensor lw,
                                                 torch::Tensor lb, double eps, torch::Tensor wconv);

OPFORGE_EXPORT(add_pool_conv_ln_pool, "x+y -> (avgpool2 -> 1x1 conv) and (channel LayerNorm -> avgpool2)");
