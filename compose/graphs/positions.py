"""Op weights by position in a fused task: producer (the first op), epilogue (an op between), head (the last).

The curated table ``compose/data/op_positions.yaml`` puts ops in classes (special functions, encodings, head
ops, scans) and gives each class a weight factor per position; the file states the rule. The sampler multiplies
an op's draw weight (its relevance, ``compose.graphs.op_weights``) by ``factor(op, position)``: so Bessel i0 or
rad2deg of a GEMM output is drawn with a fiftieth of its weight, never as the first op, and a sort mostly ends
a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

POSITIONS = ("producer", "epilogue", "head")
DEFAULT_PATH = Path(__file__).parent.parent / "data" / "op_positions.yaml"


class PositionTableError(ValueError):
    """The position table is malformed; the message names the file and the field."""


@dataclass
class PositionTable:
    """classes: class -> {position: factor >= 0}; ops: op name (``compose.graphs.axes.op_name``) -> class."""

    classes: dict[str, dict[str, float]] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)

    def factor(self, op: str, position: str) -> float:
        """Weight factor of ``op`` at ``position`` (1.0 for an op in no class). Raises ValueError for an
        unknown position."""
        if position not in POSITIONS:
            raise ValueError(f"unknown position {position!r}; choices: {', '.join(POSITIONS)}")
        cls = self.ops.get(op)
        return 1.0 if cls is None else self.classes[cls][position]


def load_positions(path=DEFAULT_PATH) -> PositionTable:
    """Read a position table YAML (``classes`` and ``ops``, as in ``compose/data/op_positions.yaml``).

    Raises FileNotFoundError, or ``PositionTableError`` naming the file and the bad field."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"op position table not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PositionTableError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("classes"), dict) or not isinstance(data.get("ops"),
                                                                                                 dict):
        raise PositionTableError(f"{path}: expected mappings 'classes' and 'ops'")
    classes = {}
    for name, factors in data["classes"].items():
        if not isinstance(factors, dict) or set(factors) != set(POSITIONS):
            raise PositionTableError(f"{path}: classes.{name}: expected factors for {', '.join(POSITIONS)}")
        for pos, v in factors.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise PositionTableError(f"{path}: classes.{name}.{pos}: expected a number >= 0, got {v!r}")
        classes[name] = {p: float(v) for p, v in factors.items()}
    ops = {}
    for cls, names in data["ops"].items():
        if cls not in classes:
            raise PositionTableError(f"{path}: ops.{cls}: no such class (classes: {', '.join(classes)})")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise PositionTableError(f"{path}: ops.{cls}: expected a list of op names")
        for n in names:
            if n in ops and ops[n] != cls:
                raise PositionTableError(f"{path}: op {n!r} is in classes {ops[n]} and {cls}")
            ops[n] = cls
    return PositionTable(classes, ops)
