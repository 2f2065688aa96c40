#include "registry.h"

std::vector<torch::Tensor> xca_forward(torch::Tensor x);

OPFORGE_EXPORT(xca_forward, "v slice (B,H,D,T) and normalize(q) @ normalize(k)^T (B,H,D,D), one kernel");
