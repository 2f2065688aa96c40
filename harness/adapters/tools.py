"""The environment's tools as a model sees them, shared by the trainer adapters: ``KernelTools`` wraps a
``harness.env.KernelEnv`` with one typed, documented method per tool (TRL reads the methods; ``tool_schemas``
renders the same signatures and docstrings as OpenAI function schemas for verifiers' chat loop). The
descriptions carry the kernel registration rules of RULES.md: sources under ``kernels/`` that
``#include "registry.h"`` and register each function with ``OPFORGE_EXPORT(fn, "doc")``, called from
``model_new.py`` through ``import opforge_kernels``.
"""

from __future__ import annotations

from typing import Any

from opforge.harness.env import TOOLS, KernelEnv


class KernelTools:
    """The tools of one ``KernelEnv`` (``env``); each public method is one tool call (one turn)."""

    def __init__(self, env: KernelEnv):
        self._env = env

    def write_file(self, path: str, content: str) -> str:
        """Write one file of your solution into the workspace, replacing it. A kernel source under `kernels/`
        starts with `#include "registry.h"` and registers each function Python may call with
        `OPFORGE_EXPORT(my_op, "what it computes");`; `model_new.py` calls it as `opforge_kernels.my_op(...)`
        after `import opforge_kernels`. `kernels/binding.cpp` and `kernels/registry.h` are fixed.

        Args:
            path: `model_new.py` or a kernel source under `kernels/` (.cpp, .cu, .h, .cuh).
            content: The whole text of the file.

        Returns:
            What was written, or why it was refused.
        """
        return self._env.write_file(path, content)

    def read_file(self, path: str) -> str:
        """Read a file of the workspace: `model.py` (the task), `RULES.md` (how kernels are registered, what
        PyTorch may do, what counts as cheating), `kernels/registry.h` (the `OPFORGE_EXPORT` macro) or your own.

        Args:
            path: Path relative to the workspace.

        Returns:
            The file's text.
        """
        return self._env.read_file(path)

    def list_files(self) -> str:
        """List the workspace's files.

        Returns:
            One path per line.
        """
        return self._env.list_files()

    def compile(self) -> str:
        """Build the sources under `kernels/` into the module `opforge_kernels` (each function registered with
        `OPFORGE_EXPORT` becomes `opforge_kernels.<name>`).

        Returns:
            Whether it built, or the compiler's errors.
        """
        return self._env.compile()

    def verify(self) -> str:
        """Check `ModelNew` against `Model` on fresh random inputs, with every rule of RULES.md.

        Returns:
            correct, or what is wrong (mismatch, rule broken, build or load error).
        """
        return self._env.verify()

    def profile(self) -> str:
        """Verify, then time your version against eager PyTorch and torch.compile.

        Returns:
            The verdict, the median times, the speed-ups and the reward on the task's shape.
        """
        return self._env.profile()

    def submit(self) -> str:
        """Run the final check (fresh inputs of the task's shape and of other input shapes) and end the episode.

        Returns:
            The verdict and the episode's reward.
        """
        return self._env.submit()


def tool_schemas() -> list[dict[str, Any]]:
    """The tools of ``KernelTools`` as OpenAI chat-completions function schemas (``{"type": "function",
    "function": {"name", "description", "parameters"}}``), from their signatures and docstrings."""
    from transformers.utils import get_json_schema

    out = []
    for name in TOOLS:
        schema = get_json_schema(getattr(KernelTools, name))
        schema["function"].pop("return", None)
        out.append(schema)
    return out
