#include "registry.h"

std::vector<torch::Tensor> se_forward(torch::Tensor x, torch::Tensor g, torch::Tensor b, torch::Tensor m,
                                      torch::Tensor v, double eps, torch::Tensor w1, torch::Tensor b1,
                                      torch::Tensor w2, torch::Tensor b2);

OPFORGE_EXPORT(se_forward, "BN(eval) + Hardswish + avg pool (one kernel), then fc1 + ReLU and fc2 (cuBLASLt)");
