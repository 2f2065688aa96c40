"""Static rules for ``model_new.py``, checked by the grader before any candidate code runs.

``model_new.py`` glues the extension's functions together; the computing happens in ``kernels/``. So it may:

* import only ``IMPORTS`` (torch and its ``nn`` / ``nn.functional``, the built ``opforge_kernels``, and
  pure-Python helpers: math, typing, functools, itertools, collections, dataclasses, numbers, enum, abc,
  operator, __future__);
* not name a module that reaches compute or process state outside the extension (``FORBIDDEN_NAMES``:
  numpy, ctypes, threading, sys, os, gc, importlib, torch.jit / compile / utils / backends /
  multiprocessing / library ...), whether as an import or as an attribute (``torch.sys``);
* not touch private or dunder attributes of anything but its own ``self`` (``torch._C``,
  ``f.__globals__``; ``super().__init__`` and the ``__init__`` / ``__name__`` family in ``DUNDER_OK`` are
  fine), nor read tensor memory from Python (``.numpy()``, ``.tolist()``, ``.data_ptr()``, storages);
* not call ``FORBIDDEN_CALLS`` (eval, exec, compile, __import__, open, globals, vars...) nor
  ``getattr`` / ``setattr`` / ``delattr`` / ``hasattr`` with a name that is not a string literal.

Run time adds the dispatcher guard (``harness.guard``) over every torch op; this check is what a candidate
cannot switch off, because it runs in the grader on the source text.
"""

from __future__ import annotations

import ast

IMPORTS = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "opforge_kernels", "math", "typing", "functools", "itertools",
    "collections", "collections.abc", "dataclasses", "numbers", "enum", "abc", "operator", "__future__",
})
FORBIDDEN_NAMES = frozenset({
    "numpy", "np", "ctypes", "cffi", "numba", "scipy", "cupy", "triton", "jax", "threading", "_thread",
    "concurrent", "multiprocessing", "asyncio", "subprocess", "signal", "sys", "os", "gc", "inspect",
    "importlib", "builtins", "types", "weakref", "pickle", "marshal", "mmap", "io", "pathlib", "shutil",
    "socket", "time", "jit", "compile", "compiler", "utils", "backends", "library", "profiler",
    "autograd", "fx", "export", "func", "futures", "hub", "package", "distributed", "cpp_extension",
    "set_num_threads", "set_num_interop_threads", "set_flush_denormal", "set_float32_matmul_precision",
    "set_default_dtype", "set_default_device", "use_deterministic_algorithms", "set_deterministic_debug_mode",
    "tolist", "data_ptr", "untyped_storage", "storage", "from_numpy", "frombuffer", "from_file",
    "as_array", "aten",
})
FORBIDDEN_CALLS = frozenset({
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "breakpoint", "input",
    "memoryview", "help", "exit", "quit",
})
NAME_ARG_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
DUNDER_OK = frozenset({"__init__", "__name__", "__class__", "__doc__", "__future__", "__call__", "__len__",
                       "__getitem__", "__repr__"})


def _private(attr: str) -> bool:
    return attr.startswith("_") and attr not in DUNDER_OK


def policy_violations(source: str, filename: str = "model_new.py") -> list[str]:
    """Rule breaks in ``source``, each as ``"<kind>:<what>"`` (``import:numpy``, ``name:threading``,
    ``attribute:_C``, ``call:eval``, ``getattr:dynamic``), de-duplicated, in source order; ``syntax:...``
    when it does not parse (then nothing else is checked)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return [f"syntax:line {exc.lineno}: {exc.msg}"]
    found: list[str] = []

    def add(item: str) -> None:
        if item not in found:
            found.append(item)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in IMPORTS:
                    add(f"import:{alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                if base not in IMPORTS or (full not in IMPORTS and alias.name in FORBIDDEN_NAMES) \
                        or _private(alias.name) or alias.name == "*":
                    add(f"import:{full}")
        elif isinstance(node, ast.Attribute):
            owner_is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if node.attr in FORBIDDEN_NAMES and not owner_is_self:
                add(f"attribute:{node.attr}")
            elif _private(node.attr) and not (owner_is_self and not node.attr.startswith("__")):
                add(f"attribute:{node.attr}")
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES and not isinstance(node.ctx, ast.Store):
                add(f"name:{node.id}")
            elif node.id in FORBIDDEN_CALLS or (node.id.startswith("__") and node.id not in DUNDER_OK):
                add(f"call:{node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAME_ARG_CALLS:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                add(f"{node.func.id}:dynamic")
            elif _private(name.value) or name.value in FORBIDDEN_NAMES:
                add(f"{node.func.id}:{name.value}")
    return found
