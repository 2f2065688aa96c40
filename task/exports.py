"""Lazy public API of a package (PEP 562), shared by every stage's ``__init__``.

A stage's ``__init__`` lists ``name -> defining module`` and binds what ``lazy_exports`` returns::

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

so ``import opforge.<stage>.<module>`` stays as cheap as that module, and ``opforge.<stage>.NAME`` imports
its module on first use only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` exporting ``exports`` (public name -> module defining it).

    ``__getattr__(name)`` imports the defining module, binds ``name`` on the package (later lookups are plain
    attribute reads) and returns it; any other name raises ``AttributeError`` naming the package.
    """

    def __getattr__(name: str) -> object:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
