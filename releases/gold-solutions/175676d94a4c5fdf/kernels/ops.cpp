#include "registry.h"

torch::Tensor talking_heads_out(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor wp, torch::Tensor bp,
                                torch::Tensor gamma);

OPFORGE_EXPORT(talking_heads_out, "z + gamma * proj(heads(x) @ y): WMMA kernel with fused permutes, cuBLASLt projection");
