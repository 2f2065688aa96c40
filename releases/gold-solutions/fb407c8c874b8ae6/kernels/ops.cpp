#include "registry.h"

torch::Tensor mixer_forward(torch::Tensor x, torch::Tensor y, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2,
                            torch::Tensor b2);

OPFORGE_EXPORT(mixer_forward, "y + (fc2(GELU(fc1(x^T))))^T as two cuBLASLt GEMMs with fused epilogues");
