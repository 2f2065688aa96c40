#include "registry.h"

torch::Tensor shared_expert_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor w, torch::Tensor wd);

OPFORGE_EXPORT(shared_expert_forward, "w + down_proj(x * y) + sum_16(z): cuBLASLt GEMM overlapped with the expert sum");
