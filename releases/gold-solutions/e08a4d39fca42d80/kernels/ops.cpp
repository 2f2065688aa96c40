#include "registry.h"

torch::Tensor bn_silu_dwconv_bn_forward(torch::Tensor x, torch::Tensor w, torch::Tensor g1, torch::Tensor b1,
                                        torch::Tensor m1, torch::Tensor v1, double eps1, torch::Tensor g2,
                                        torch::Tensor b2, torch::Tensor m2, torch::Tensor v2, double eps2);

OPFORGE_EXPORT(bn_silu_dwconv_bn_forward, "BN(eval) -> SiLU -> pad -> depthwise 5x5/2 conv -> BN(eval), one kernel");
