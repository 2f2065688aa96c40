"""What every generator's tasks share: the KernelBench source layout (``task_source``), constant literals and the
trained-like state of normalisation modules. The random composer (``compose.graphs``), motif mining
(``compose.motifs``) and the transformers blocks (``compose.blocks``) all render through it."""

from __future__ import annotations

import math


def literal(v) -> str:
    """Python source of a constant (non-finite floats as ``float('inf')``)."""
    if isinstance(v, float):
        return repr(float(v)) if math.isfinite(v) else f"float('{v}')"
    return repr(v)


# Trained-like state of normalisation modules, set in ``__init__`` (seeded by the task's build seed): with
# PyTorch's defaults (running mean 0, variance 1, weight 1, bias 0) an eval-mode BatchNorm is x / sqrt(1 + eps),
# which a kernel could drop. Values: running mean ~ N(0, 0.1^2), running variance ~ U(0.5, 1.5), weight ~
# N(1, 0.1^2), bias ~ N(0, 0.1^2) (magnitudes of trained ResNet-50 BatchNorm statistics, order of magnitude).
_NORM_STATE = (("running_mean", "normal_(0.0, 0.1)"), ("running_var", "uniform_(0.5, 1.5)"),
               ("weight", "normal_(1.0, 0.1)"), ("bias", "normal_(0.0, 0.1)"))


def _norm_state_lines(module, attr: str) -> list[str]:
    """``with torch.no_grad()`` body lines giving ``self.<attr>`` trained-like statistics and affine parameters,
    for a module that has running statistics or is a normalisation layer; [] otherwise."""
    import torch

    has_stats = isinstance(getattr(module, "running_mean", None), torch.Tensor)
    is_norm = has_stats or "Norm" in type(module).__name__
    lines = []
    if not is_norm or "Lazy" in type(module).__name__:
        return lines
    for name, init in _NORM_STATE:
        t = getattr(module, name, None)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1:
            lines.append(f"self.{attr}.{name}.{init}")
    return lines


def task_source(imports: list[str], docstring: str, init_lines: list[str], forward_args: list[str],
                forward_lines: list[str], constants: list[str], input_lines: list[str], returned: str,
                definitions: list[str] = (), header: list[str] = ()) -> str:
    """The KernelBench layout shared by every rendered task (fused graphs and transformers blocks):
    ``header`` lines, the torch imports and ``imports``, top-level ``definitions`` (helper functions and
    classes, each a source block), ``Model``, size constants, ``get_inputs()`` returning ``[returned]`` and an
    empty ``get_init_inputs()``."""
    ind = "        "
    defs = [line for block in definitions for line in ("", block, "")]
    return "\n".join([
        *header,
        "import torch",
        "import torch.nn as nn",
        *imports,
        "",
        *defs,
        "",
        "class Model(nn.Module):",
        f'    """{docstring}"""',
        "",
        "    def __init__(self):",
        "        super().__init__()",
        *[ind + line for line in init_lines],
        "",
        f"    def forward(self, {', '.join(forward_args)}):",
        *[ind + line for line in forward_lines],
        "",
        "",
        *constants,
        "",
        "",
        "def get_inputs():",
        *["    " + line for line in input_lines],
        f"    return [{returned}]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
        "",
    ])
