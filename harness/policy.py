"""Static rules for ``model_new.py``, checked by the grader on the source text before any candidate code runs.

``model_new.py`` glues the extension's functions together; the computing happens in ``kernels/``. The rules
deny what reaches compute outside the extension or the machinery of the candidate's own process (the
dispatcher guard, threads, other processes), and nothing else, so ordinary Python (``os.path``, ``open``,
``math``, ``dataclasses``...) stays usable:

* imports (``import X`` / ``from X import Y``, resolved through ``as`` aliases) of ``DENIED_MODULES``
  (numpy and other array libraries, ctypes / cffi, threads and processes, ``gc`` / ``inspect`` /
  ``importlib`` / ``builtins`` / ``pickle``, the ``opforge`` package itself) or of a torch part under
  ``DENIED_TORCH`` (``torch._*``, ``torch.utils``, ``torch.jit``, ``torch.compile`` / ``compiler``,
  ``torch.backends``, ``torch.library``, ``torch.profiler``, ``torch.multiprocessing``,
  ``torch.distributed``, ``torch.fx``, ``torch.export``, ``torch.ops.aten``, the global settings
  ``torch.set_num_threads`` / ``set_flush_denormal`` / ``set_float32_matmul_precision`` /
  ``set_default_dtype`` / ``use_deterministic_algorithms``...); the same names reached as attributes
  (``torch.backends.cuda``, ``torch.ops.aten.relu``);
* attributes in ``DENIED_ATTRS`` on anything (reading tensor memory from Python: ``.numpy()``,
  ``.tolist()``, ``.data_ptr()``, storages; process state: ``sys.modules``, ``settrace``, ``fork``,
  ``system``, ``kill``...), and private or dunder attributes of anything but the module's own ``self``
  (``torch._C``, ``f.__globals__``; ``super().__init__`` and the names in ``DUNDER_OK`` are fine);
* the builtins ``DENIED_CALLS`` (eval, exec, compile, __import__, globals, locals, vars, breakpoint) and
  ``getattr`` / ``setattr`` / ``delattr`` / ``hasattr`` with a name that is not a string literal.

At run time the dispatcher guard (``harness.guard``) checks every torch op; these rules are what a candidate
cannot switch off, because they are applied in the grader. They do not make the candidate's process a
sandbox: see the threat model in the README.
"""

from __future__ import annotations

import ast

DENIED_MODULES = frozenset({
    "numpy", "ctypes", "_ctypes", "cffi", "numba", "scipy", "cupy", "triton", "jax", "tensorflow", "pandas",
    "threading", "_thread", "concurrent", "multiprocessing", "asyncio", "subprocess", "signal", "gc",
    "inspect", "importlib", "builtins", "pickle", "marshal", "mmap", "types", "code", "codeop", "runpy",
    "opforge", "torchvision", "sched", "faulthandler", "tracemalloc", "sysconfig", "pty", "resource",
})
DENIED_TORCH = ("torch._", "torch.utils", "torch.jit", "torch.compile", "torch.compiler", "torch.backends",
                "torch.library", "torch.profiler", "torch.multiprocessing", "torch.distributed", "torch.fx",
                "torch.export", "torch.ops.aten", "torch.package", "torch.hub", "torch.onnx", "torch.autograd.profiler",
                "torch.set_num_threads", "torch.set_num_interop_threads", "torch.set_flush_denormal",
                "torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_default_device",
                "torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode", "torch.from_numpy",
                "torch.frombuffer", "torch.from_file", "torch.nn.modules.module", "torch.cuda.set_stream",
                "torch.cuda.memory", "torch.cuda.nvtx", "torch.cuda.jiterator", "torch.cuda.graphs")
DENIED_ATTRS = frozenset({
    "numpy", "tolist", "data_ptr", "untyped_storage", "storage", "_storage", "modules", "settrace",
    "setprofile", "fork", "forkpty", "system", "popen", "execv", "execve", "execl", "execlp", "execvp",
    "execvpe", "spawnv", "spawnl", "spawnve", "posix_spawn", "kill", "killpg", "getppid", "dlopen",
    "start_new_thread", "Thread", "ThreadPoolExecutor", "ProcessPoolExecutor", "jiterator",
})
DENIED_CALLS = frozenset({"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint"})
NAME_ARG_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
DUNDER_OK = frozenset({"__init__", "__name__", "__class__", "__doc__", "__future__", "__call__", "__len__",
                       "__getitem__", "__repr__", "__main__", "__annotations__"})


def _private(attr: str) -> bool:
    return attr.startswith("_") and attr not in DUNDER_OK


def denied_module(name: str) -> bool:
    """True when importing ``name`` (dotted) is against the rules."""
    top = name.split(".")[0]
    return top in DENIED_MODULES or any(name == p or name.startswith(p if p.endswith("_") else p + ".")
                                        or (p.endswith("_") and name.startswith(p)) for p in DENIED_TORCH)


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` of a name / attribute chain with its first name resolved through ``aliases`` (import
    aliases), or None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def policy_violations(source: str, filename: str = "model_new.py") -> list[str]:
    """Rule breaks in ``source``, each as ``"<kind>:<what>"`` (``import:numpy``, ``attribute:torch.backends``,
    ``attribute:_C``, ``call:eval``, ``getattr:dynamic``), de-duplicated, in walk order. A source that does
    not parse gives no finding (it fails to import, a ``load_error``)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    found: list[str] = []
    aliases: dict[str, str] = {}

    def add(item: str) -> None:
        if item not in found:
            found.append(item)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if denied_module(alias.name):
                    add(f"import:{alias.name}")
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                add(f"import:{'.' * node.level}{base}")
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if denied_module(base) or denied_module(full) or _private(alias.name) or alias.name == "*" \
                        or alias.name in DENIED_ATTRS:
                    add(f"import:{full}")
                aliases[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner_is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            dotted = dotted_name(node, aliases)
            if dotted and denied_module(dotted) and not owner_is_self:
                add(f"attribute:{dotted}")
            elif node.attr in DENIED_ATTRS and not owner_is_self:
                add(f"attribute:{node.attr}")
            elif _private(node.attr) and not (owner_is_self and not node.attr.startswith("__")):
                add(f"attribute:{node.attr}")
        elif isinstance(node, ast.Name):
            if node.id in DENIED_CALLS or (node.id.startswith("__") and node.id not in DUNDER_OK):
                add(f"call:{node.id}")
            elif isinstance(node.ctx, ast.Load) and node.id in aliases and denied_module(aliases[node.id]):
                add(f"name:{node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAME_ARG_CALLS:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                add(f"{node.func.id}:dynamic")
            elif _private(name.value) or name.value in DENIED_ATTRS:
                add(f"{node.func.id}:{name.value}")
    return found
