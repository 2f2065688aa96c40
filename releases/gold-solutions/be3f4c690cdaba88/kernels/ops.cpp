#include "registry.h"

std::vector<torch::Tensor> dense_layer_forward(torch::Tensor x, torch::Tensor y, torch::Tensor wconv, torch::Tensor g,
                                               torch::Tensor b, torch::Tensor m, torch::Tensor v, double eps);

OPFORGE_EXPORT(dense_layer_forward, "conv3x3(ReLU(x)) via cuDNN, then ReLU(BN(cat[y, conv])) in one pass");
