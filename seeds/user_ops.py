"""A researcher's own seed ops: an ``nn.Module`` class or a function named by import path in a spec entry.

An own op is one seed op however many torch ops its ``forward`` calls: the harvest probes it like any spec
entry (shapes on ``meta``, one CPU forward, dtypes), without the one-call label check of torch ops, and a
rendered task holds its source (``user_source``), so the task stays self-contained: its ``ops`` entry is the
op's label, which is its class or function name.

Import paths (``qualname`` of a spec entry): ``package.module.Name``, ``package.module:Name`` or
``path/to/file.py:Name`` (a relative file path is read from the spec file's folder). The source must need
nothing beyond ``torch``, ``torch.nn as nn`` and ``torch.nn.functional as F`` (what every task imports) and
the helpers it defines itself.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any


def closest(name: str, known, n: int = 3) -> str:
    """`` (closest: a, b)`` for the ``n`` names of ``known`` most like ``name`` (difflib ratio >= 0.6), or ''."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=n)
    return f" (closest: {', '.join(near)})" if near else ""


def _load_file(path: Path):
    """The module of a Python file, imported once under a name made from its resolved path."""
    path = path.resolve()
    name = "opforge_user_" + "".join(c if c.isalnum() else "_" for c in str(path.with_suffix("")))[-80:]
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ImportError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def resolve(qualname: str, base: Path | None = None) -> Any:
    """The object at ``qualname`` (``pkg.mod.Name``, ``pkg.mod:Name`` or ``file.py:Name``; a relative file
    is looked up under ``base``). Raises ImportError / AttributeError naming the path and the closest names."""
    if ":" in qualname:
        mod_path, _, attr = qualname.rpartition(":")
        if mod_path.endswith(".py"):
            p = Path(mod_path)
            module = _load_file(p if p.is_absolute() or base is None else Path(base) / p)
        else:
            module = importlib.import_module(mod_path)
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                names = [n for n in dir(obj) if not n.startswith("_")]
                raise AttributeError(f"{qualname!r}: {mod_path} has no {part!r}{closest(part, names)}")
            obj = getattr(obj, part)
        return obj
    parts = qualname.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            if not hasattr(obj, p):
                names = [n for n in dir(obj) if not n.startswith("_")]
                raise AttributeError(f"{qualname!r}: {'.'.join(parts[:i])} has no {p!r}{closest(p, names)}")
            obj = getattr(obj, p)
        return obj
    raise ImportError(f"cannot import {qualname!r}")


def absolute(qualname: str, base: Path) -> str:
    """``qualname`` with a relative ``file.py:Name`` path made absolute against ``base`` (others unchanged)."""
    mod_path, sep, attr = qualname.rpartition(":")
    if sep and mod_path.endswith(".py") and not Path(mod_path).is_absolute():
        return f"{(Path(base) / mod_path).resolve()}:{attr}"
    return qualname


def is_user(qualname: str) -> bool:
    """True when ``qualname`` is outside torch, transformers and Python's ``operator`` module (an own op)."""
    return not qualname.startswith(("torch.", "transformers.", "operator."))


def user_source(qualname: str) -> str:
    """The source of the class or function at ``qualname``, dedented, as a task holds it. Raises OSError
    when Python cannot read it (a class defined in a REPL or built at run time)."""
    return textwrap.dedent(inspect.getsource(resolve(qualname))).rstrip()
