"""Command-line options derived from settings models: a setting is declared once (name, type, bounds,
help text) on its pydantic model, e.g. ``engine.settings.EngineSettings``, and a command takes it as
``--name-with-dashes`` without declaring it again."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

import typer
from pydantic import BaseModel


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def settings_options(model: type[BaseModel], names: tuple[str, ...], panel: str,
                     into: str = "settings_given") -> Callable[[Callable], Callable]:
    """Decorator for a typer command: one option per field of ``model`` in ``names`` (``--gpu-growth`` for
    ``gpu_growth``, the field's type and description, default None, shown under the help panel ``panel``).
    The command receives the options given as a dict (field -> value, the ones left out absent) in its
    keyword argument ``into``; values are checked against the field's bounds by the model itself when the
    command builds it."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != into]
        extra = []
        for name in names:
            info = model.model_fields[name]
            option = typer.Option(None, f"--{name.replace('_', '-')}", help=info.description,
                                  rich_help_panel=panel)
            extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                           annotation=_without_none(info.annotation) | None))

        @functools.wraps(fn)
        def command(**kwargs):
            given = {n: kwargs.pop(n) for n in names}
            return fn(**kwargs, **{into: {k: v for k, v in given.items() if v is not None}})

        command.__signature__ = sig.replace(parameters=[
            *[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own], *extra])
        return command

    return wrap
