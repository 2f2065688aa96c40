"""Optional libraries that fail soft: a torchvision (or timm) that is installed but does not import is blocked
for the rest of the process, so transformers treats it as absent and the rest runs.

A torchvision built for another torch raises at import (``RuntimeError: operator torchvision::nms does not
exist``), and transformers imports it from many model files, so one broken wheel stopped every model.
``guard_optional_imports()`` imports each installed one once; one that raises is set to ``None`` in
``sys.modules`` (``import`` then raises ImportError and ``importlib.util.find_spec`` returns None, which is how
transformers' availability checks see it). timm needs torchvision, so it is blocked with it. Call it before
transformers is imported (the ``opforge`` command line does, and so does each composer process).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

OPTIONAL = ("torchvision", "timm")
_BROKEN: dict[str, str] = {}


def guard_optional_imports() -> dict[str, str]:
    """Block each library of ``OPTIONAL`` that is installed but raises on import; returns name -> one-line
    reason for the blocked ones (the same on every call in a process)."""
    for name in OPTIONAL:
        if name in _BROKEN or (name in sys.modules and sys.modules[name] is not None):
            continue
        if name == "timm" and "torchvision" in _BROKEN:
            if importlib.util.find_spec("timm") is not None:
                _BROKEN[name] = "needs torchvision, which does not import"
                sys.modules[name] = None
            continue
        try:
            if importlib.util.find_spec(name) is None:
                continue
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure of an optional library blocks it
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]
            sys.modules[name] = None
            _BROKEN[name] = msg
    return dict(_BROKEN)
