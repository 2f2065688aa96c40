"""Load a KernelBench-format task source into a namespace and check its contract."""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass
from typing import Any

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskFormatError(ValueError):
    """A task source breaks the KernelBench contract. The message names the task and what is wrong."""


@dataclass
class LoadedTask:
    """A task source executed into its own module namespace.

    Attributes:
        name: where the source came from (task_id, file path or row), used in error messages.
        module: the module object holding the task's globals.
    """

    name: str
    module: types.ModuleType

    @property
    def Model(self) -> type:  # noqa: N802 - the task format's name
        return self.module.Model

    def init_inputs(self) -> list[Any]:
        """Constructor arguments from ``get_init_inputs()``, as a list."""
        return list(self.module.get_init_inputs())

    def inputs(self) -> list[Any]:
        """Fresh forward inputs from ``get_inputs()``, as a list."""
        out = self.module.get_inputs()
        if not isinstance(out, (list, tuple)):
            raise TaskFormatError(f"{self.name}: get_inputs() returned {type(out).__name__}, expected a list")
        return list(out)

    def build(self):
        """Instantiate ``Model(*get_init_inputs())`` (in the current default device context)."""
        return self.Model(*self.init_inputs())


def check_source(code: str, name: str = "<task>") -> ast.Module:
    """Parse ``code`` and check it defines ``Model``, ``get_inputs`` and ``get_init_inputs`` at top level.

    Returns the parsed module. Raises:
        TaskFormatError: not a string, a syntax error (with line number) or a missing definition.
    """
    if not isinstance(code, str) or not code.strip():
        raise TaskFormatError(f"{name}: task code is empty or not a string")
    try:
        tree = ast.parse(code, filename=name)
    except SyntaxError as exc:
        raise TaskFormatError(f"{name}: syntax error at line {exc.lineno}: {exc.msg}") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise TaskFormatError(f"{name}: missing top-level definition(s) {', '.join(missing)}")
    return tree


def load_task(code: str, name: str = "<task>") -> LoadedTask:
    """Execute a task source in a fresh module namespace.

    Raises:
        TaskFormatError: the source does not parse, misses a required name, or fails at import time
            (the exception type and message are included).
    """
    tree = check_source(code, name)
    module = types.ModuleType(f"opforge_task_{abs(hash(name)) % 10**8}")
    module.__dict__["__file__"] = name
    try:
        exec(compile(tree, name, "exec"), module.__dict__)
    except Exception as exc:  # the task's own import-time code failed
        raise TaskFormatError(f"{name}: executing the task source raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(module.__dict__.get("Model"), type):
        raise TaskFormatError(f"{name}: Model is not a class")
    return LoadedTask(name=name, module=module)


def flatten_tensors(obj: Any) -> list:
    """Tensors found in ``obj`` (a tensor, or nested tuples / lists / dicts of them), depth-first."""
    import torch

    return _flatten(obj, torch.Tensor)


def _flatten(obj: Any, tensor: type) -> list:
    if isinstance(obj, tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _flatten(item, tensor)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _flatten(item, tensor)]
    return []
