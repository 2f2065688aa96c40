#include "registry.h"

torch::Tensor block_head_forward(torch::Tensor x, torch::Tensor y, torch::Tensor wconv, torch::Tensor g,
                                 torch::Tensor b, torch::Tensor m, torch::Tensor v, double eps, torch::Tensor wfc,
                                 torch::Tensor bfc);

OPFORGE_EXPORT(block_head_forward, "conv3x3 (cuDNN) -> BN + y + ReLU + avg pool (one kernel) -> Linear (cuBLASLt)");
