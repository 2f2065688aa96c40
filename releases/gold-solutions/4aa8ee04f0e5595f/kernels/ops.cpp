#include "registry.h"

torch::Tensor shared_expert_residual_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor wd);

OPFORGE_EXPORT(shared_expert_residual_forward, "z + (y + x @ Wd^T): chunked cuBLASLt GEMMs, residual passes overlapped on a side stream");
