"""The ``SeedOp`` record: one validated operator the composer may draw from (docs/DESIGN.md §3)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Size symbols of input recipes and the concrete value each takes while probing. ``C`` is the
# channel / feature dimension that constructor arguments such as ``in_channels`` bind to; ``K`` is a
# free output-feature size chosen by the composer; ``A`` (attention heads) and ``E`` (head dim) shape
# multi-head attention inputs.
PROBE_SIZES: dict[str, int] = {"N": 2, "C": 16, "K": 8, "L": 20, "H": 12, "W": 10, "D": 6, "A": 2, "E": 8}
SYMBOLS = frozenset(PROBE_SIZES)

# Shape templates tried, in order of preference, for the primary input of an op.
TEMPLATES: dict[str, list[str]] = {
    "NCHW": ["N", "C", "H", "W"],
    "NCL": ["N", "C", "L"],
    "NC": ["N", "C"],
    "NHWC": ["N", "H", "W", "C"],
    "NLC": ["N", "L", "C"],
    "NCDHW": ["N", "C", "D", "H", "W"],
    "C": ["C"],
    "NALE": ["N", "A", "L", "E"],  # (batch, heads, seq, head_dim): attention; curated specs only
}
# Templates the probe tries for a harvested op without a curated recipe (``NALE`` is for attention specs).
AUTO_TEMPLATES = ("NCHW", "NCL", "NC", "NHWC", "NLC", "NCDHW", "C")

ValueKind = str  # "normal" | "unit" | "positive" | "index:<int or symbol>" | "bool"
DTYPES = ("float32", "int64", "bool")


class TensorSpec(BaseModel):
    """How to make one tensor input.

    ``shape`` is a list of size symbols (see ``PROBE_SIZES``) and ints, or the string ``"like:<i>"`` for
    "the same shape as input *i*". ``values``: ``normal`` (``torch.randn``), ``unit`` (``torch.rand``, in
    [0, 1)), ``positive`` (``rand + 0.1``), ``bool`` or ``index:<n>`` (int64 in [0, n); ``n`` an int or a
    size symbol).
    """

    model_config = ConfigDict(extra="forbid")

    shape: list[str | int] | str
    dtype: Literal["float32", "int64", "bool"] = "float32"
    values: ValueKind = "normal"

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, v):
        if isinstance(v, str):
            if not v.startswith("like:") or not v[5:].isdigit():
                raise ValueError(f"shape string must be 'like:<input index>', got {v!r}")
            return v
        for d in v:
            if isinstance(d, str) and d not in SYMBOLS:
                raise ValueError(f"unknown size symbol {d!r}; known: {sorted(SYMBOLS)}")
            if isinstance(d, int) and d <= 0:
                raise ValueError(f"sizes must be positive, got {d}")
        return v

    @field_validator("values")
    @classmethod
    def _check_values(cls, v):
        if v in ("normal", "unit", "positive", "bool"):
            return v
        if v.startswith("index:") and (v[6:].isdigit() or v[6:] in SYMBOLS):
            return v
        raise ValueError(f"values must be normal|unit|positive|bool|index:<n>, got {v!r}")


# Columns stored as JSON strings in the Parquet catalog.
def _sorted_keys(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _sorted_keys(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [_sorted_keys(x) for x in v]
    return v


JSON_FIELDS = ("init_args", "call_args", "inputs", "params", "templates", "output_shape", "config", "dtypes")

# Floating dtypes a seed op's CPU forward may accept (``SeedOp.dtypes``), float32 first.
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


class SeedOp(BaseModel):
    """One seed operator.

    Attributes:
        label: Ops-6K spelling (``nn.Conv2d``, ``F.gelu``, ``torch.cumsum``; transformers: class name).
        qualname: importable dotted path of the class or function.
        library / library_version: ``torch``, ``transformers`` (and its installed version) or ``user``: a
            researcher's own module or function (``seeds.user_ops``; its label is its class / function name).
        kind: ``module`` (instantiated in ``__init__``) or ``function`` (called in ``forward``).
        category: coarse op family (``seeds.categories.CATEGORIES``).
        init_args: constructor keyword arguments (modules); ``"$C"`` etc. bind to the input's sizes.
        call_args: extra non-tensor keyword arguments of the call.
        inputs: tensor arguments in call order; the first is the primary (data-flow) input.
        params: tensor keyword arguments of a function op rendered as ``nn.Parameter`` (e.g. weights).
        tensor_list: the tensor inputs are passed as one list (``torch.cat([a, b], dim=1)``).
        templates: names of ``TEMPLATES`` the primary input may take (rank polymorphism).
        output_index: index into a tuple output, or None for a tensor output.
        output_dtype / output_shape: of the probe's output at ``PROBE_SIZES`` (first template).
        stochastic: the output depends on the RNG (two calls on one input differ, module in train mode).
        meta_ok: shapes propagate on the ``meta`` device (False: data-dependent output, CPU only).
        validated: how the recipe was confirmed, e.g. ``meta+cpu``.
        source: ``auto`` or ``spec:<yaml file>``.
        family / config_class / config: transformers model family and the small config that builds it.
        dtypes: the ``FLOAT_DTYPES`` its CPU forward accepts (``seeds.probe.probe_dtypes``: float tensors and
            module state cast to the dtype, one forward, a finite output of that dtype); ``["float32"]`` in
            catalogs written before the field existed.
    """

    model_config = ConfigDict(extra="forbid")

    label: str
    qualname: str
    library: Literal["torch", "transformers", "user"] = "torch"
    library_version: str = ""
    kind: Literal["module", "function"]
    category: str = ""
    init_args: dict[str, Any] = Field(default_factory=dict)
    call_args: dict[str, Any] = Field(default_factory=dict)
    inputs: list[TensorSpec] = Field(default_factory=list)
    params: dict[str, TensorSpec] = Field(default_factory=dict)
    templates: list[str] = Field(default_factory=list)
    tensor_list: bool = False
    output_index: int | None = None
    output_dtype: str = "float32"
    output_shape: list[int] = Field(default_factory=list)
    stochastic: bool = False
    meta_ok: bool = True
    validated: str = ""
    source: str = "auto"
    family: str | None = None
    config_class: str | None = None
    config: dict[str, Any] | None = None
    dtypes: list[Literal["float32", "bfloat16", "float16"]] = Field(default_factory=lambda: ["float32"])

    @field_validator("init_args", "call_args", "params", "config", mode="after")
    @classmethod
    def _canonical_key_order(cls, v):
        """Keys in sorted order at every depth (keyword arguments: their order means nothing), as a catalog
        row stores them, so that a harvested op and the same op read back from Parquet compose alike."""
        return _sorted_keys(v)

    def to_row(self) -> dict[str, Any]:
        row = self.model_dump()
        for f in JSON_FIELDS:
            row[f] = json.dumps(row[f], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SeedOp:
        data = dict(row)
        if data.get("dtypes") is None:
            data.pop("dtypes", None)  # a catalog written before the field: the default
        for f in JSON_FIELDS:
            if isinstance(data.get(f), str):
                data[f] = json.loads(data[f])
        return cls(**data)


class SkipRecord(BaseModel):
    """Why a candidate op did not enter the catalog."""

    label: str
    qualname: str
    library: str
    reason: str
    detail: str = ""
