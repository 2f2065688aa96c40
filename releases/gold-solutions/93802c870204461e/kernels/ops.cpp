#include "registry.h"

std::vector<torch::Tensor> se_conv_bn_gelu(torch::Tensor x, torch::Tensor y, torch::Tensor w1, torch::Tensor b1,
                                           torch::Tensor w2, torch::Tensor g, torch::Tensor bb, torch::Tensor m,
                                           torch::Tensor v, double eps);

OPFORGE_EXPORT(se_conv_bn_gelu, "SE gate * y (output 1), then 1x1 conv (cuBLASLt) + BN + GELU (output 2)");
