#include "registry.h"

torch::Tensor fused_forward(torch::Tensor x);

OPFORGE_EXPORT(fused_forward, "logsigmoid(x) * x in one kernel");
