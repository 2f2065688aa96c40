"""The evaluation contract: one text, shown everywhere an agent or a trainer looks.

``contract_text()`` states how a candidate is graded: the reference's mode (``eval()`` under
``torch.no_grad()``), the tolerance of each output dtype (``opforge.task.precision``), the hidden shape
variants, the reward tiers (``harness.reward``) and the library policy (``harness.libraries``). It is
generated from those modules, so the text cannot drift from what the grader does. It appears in
``harness/templates/RULES.md`` (the workspace's task text, and in full in the KernelEnv, TRL, OpenEnv and
verifiers prompts; ``harness.env.instruction`` adds it when a prompt leaves RULES.md out) and in the data card
(``data_cards/contract.md.j2``). ``python -m opforge.harness.contract`` prints it; ``--write`` puts it into
RULES.md between ``START`` and ``END``.
"""

from __future__ import annotations

import sys
from pathlib import Path

START = "<!-- opforge:contract:start -->"
END = "<!-- opforge:contract:end -->"
RULES = Path(__file__).resolve().parent / "templates" / "RULES.md"


def _tolerances() -> str:
    import torch
    from opforge.task.precision import TASK_DTYPES, tolerance

    parts = []
    for name in TASK_DTYPES:
        atol, rtol = tolerance(getattr(torch, name))
        parts.append(f"{name} {atol:g}" if atol == rtol else f"{name} atol {atol:g} / rtol {rtol:g}")
    return ", ".join(parts)


def contract_text() -> str:
    """The contract as markdown, starting with its heading ``## Evaluation contract``."""
    from opforge.harness.reward import MARGIN

    pct = round((MARGIN - 1) * 100)
    return f"""## Evaluation contract
- **Reference**: `Model` is built with `get_init_inputs()`, put in `eval()` mode and called under
  `torch.no_grad()`: BatchNorm uses its running statistics, dropout is off. Its parameters and buffers (the
  state dict) are loaded into `ModelNew` after it is built, so keep their names.
- **Correctness**: every call, on fresh random inputs from `get_inputs()` (secret seeds): the same number of
  outputs, each with the reference's shape and dtype, and `|out - ref| <= atol + rtol * |ref|` elementwise,
  atol = rtol by the reference output's dtype: {_tolerances()}
  (integer and bool outputs must match exactly).
- **Hidden shape variants**: the final check also runs other sizes of the task's size constants (the batch,
  sometimes the sequence length or the spatial size) that `model.py` does not show. Read every size from the
  tensors; never hard-code one.
- **Reward**: -1 when the solution is wrong, fails to build or load, or breaks a rule; 1 when correct; 2 when
  correct and more than {pct} % faster than eager (speed-up > {MARGIN:g}); 3 when also more than {pct} % faster
  than `torch.compile`. Times are medians of timed bursts on fresh inputs (on a GPU, CUDA-graph replays when
  every target can be captured), taken from outside your process; eager and `torch.compile` (default mode)
  are timed the same way.
- **Precision**: the reference runs with TF32 off. Inside your kernels the arithmetic is yours to choose
  (TF32 or half-precision tensor cores, the order of a reduction) as long as every output passes the
  tolerance above on every input.
- **Libraries**: GEMMs may call cuBLAS / cuBLASLt (with its epilogues) and convolutions cuDNN (including
  fused conv-bias-activation and the graph / backend API with a convolution in the graph) directly from C++ /
  CUDA: the `gemm` routines, `cublasLt` matmul, the `cudnn` convolution routines and their handle, stream,
  workspace and descriptor calls. Create each handle once and set its stream to the current CUDA stream on
  every call. Nothing else from a library: no other cuBLAS / cuDNN routine (`axpy`, `scal`, `geam`, `gemv`,
  softmax, pooling, normalization...), no cuFFT, cuSPARSE, cuSOLVER, cuRAND, NCCL, cuTENSOR, NPP, Thrust or
  CUB device-wide algorithms, no torch library handle, and no ATen / torch compute route (Python or C++)."""


def rules_with_contract(rules: str) -> str:
    """``rules`` (RULES.md's text) with the block between ``START`` and ``END`` set to ``contract_text()``.
    Raises ValueError when the markers are missing."""
    if START not in rules or END not in rules:
        raise ValueError(f"RULES.md: no {START} ... {END} block")
    a, b = rules.index(START) + len(START), rules.index(END)
    return rules[:a] + "\n" + contract_text() + "\n" + rules[b:]


def main(argv: list[str] | None = None) -> None:
    """Print the contract; ``--write``: write it into RULES.md."""
    argv = sys.argv[1:] if argv is None else argv
    if "--write" in argv:
        RULES.write_text(rules_with_contract(RULES.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote the contract into {RULES}")
    else:
        print(contract_text())


if __name__ == "__main__":
    main()
