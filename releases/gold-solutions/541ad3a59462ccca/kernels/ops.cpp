#include "registry.h"

std::vector<torch::Tensor> resmlp_forward(torch::Tensor x, torch::Tensor alpha, torch::Tensor beta, torch::Tensor wt,
                                          torch::Tensor bt, torch::Tensor ls1, torch::Tensor alpha1,
                                          torch::Tensor beta1);

OPFORGE_EXPORT(resmlp_forward, "ResMLP token mixing: cuBLASLt GEMM on raw x, one fused affine / residual epilogue");
