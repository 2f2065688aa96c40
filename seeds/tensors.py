"""Make concrete tensors from ``TensorSpec`` recipes (shared by the probe, the composer and tests)."""

from __future__ import annotations

import torch
from opforge.seeds.seed_op import TEMPLATES, TensorSpec

_DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}


def resolve_value(value, sizes: dict[str, int]):
    """Replace ``"$SYM"`` strings (also inside lists) with ``sizes[SYM]``."""
    if isinstance(value, str) and value.startswith("$"):
        return sizes[value[1:]]
    if isinstance(value, list):
        return [resolve_value(v, sizes) for v in value]
    return value


def concrete_shape(spec: TensorSpec, sizes: dict[str, int], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Concrete shape of ``spec`` given symbol sizes and the shapes of earlier inputs (for ``like:i``)."""
    if isinstance(spec.shape, str):
        return tuple(shapes[int(spec.shape[5:])])
    return tuple(sizes[d] if isinstance(d, str) else d for d in spec.shape)


def make_tensor(spec: TensorSpec, shape: tuple[int, ...], sizes: dict[str, int], device="cpu",
                generator: torch.Generator | None = None) -> torch.Tensor:
    """A random tensor for ``spec`` of the given shape on ``device`` (values follow ``spec.values``)."""
    kw = {"device": device}
    if device != "meta" and generator is not None:
        kw["generator"] = generator
    if spec.values.startswith("index:"):
        n = spec.values[6:]
        high = sizes[n] if n in sizes else int(n)
        return torch.randint(0, high, shape, dtype=torch.int64, **kw)
    if spec.values == "bool" or spec.dtype == "bool":
        return torch.rand(shape, **kw) > 0.5
    if spec.values == "unit":
        t = torch.rand(shape, **kw)
    elif spec.values == "positive":
        t = torch.rand(shape, **kw) + 0.1
    else:
        t = torch.randn(shape, **kw)
    return t.to(_DTYPES[spec.dtype])


def template_sizes(template: str, shape: tuple[int, ...]) -> dict[str, int]:
    """Bind the symbols of ``TEMPLATES[template]`` to the dims of ``shape``."""
    return dict(zip(TEMPLATES[template], shape, strict=True))
