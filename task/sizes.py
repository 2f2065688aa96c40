"""Module-level size constants of a KernelBench-format task: read them, tell which ones only shape the inputs,
and write a copy of the source with other values.

A *size constant* is a top-level assignment of a positive int literal (``batch_size = 512``). Composed tasks
write every input size this way (``compose.graphs.render``), and so do most KernelBench / Ops-6K tasks. A constant is
*free* when nothing but ``get_inputs`` depends on it: no reference from ``Model``, ``get_init_inputs``, any
other top-level definition, or a top-level constant that one of those uses (followed transitively through
constants derived from it, ``dim = seq_len * 2``). Changing a free constant changes the input shapes and
nothing that the weights are built from, so the same ``Model`` runs on both.
"""

from __future__ import annotations

import ast

from opforge.task.source import check_source


def size_constants(code: str, name: str = "<task>") -> dict[str, int]:
    """``{name: value}`` of the top-level ``NAME = <positive int literal>`` assignments, in source order.

    Raises:
        TaskFormatError: the source does not parse or misses a required definition.
    """
    tree = check_source(code, name)
    out: dict[str, int] = {}
    for node in tree.body:
        target, value = _single_assignment(node)
        if target and isinstance(value, ast.Constant) and type(value.value) is int and value.value > 0:
            out[target] = value.value
    return out


def _single_assignment(node: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id, node.value
    return None, None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def free_constants(code: str, name: str = "<task>") -> set[str]:
    """The size constants only ``get_inputs`` depends on (see the module docstring).

    Raises:
        TaskFormatError: the source does not parse or misses a required definition.
    """
    tree = check_source(code, name)
    constants = size_constants(code, name)
    assigned: dict[str, set[str]] = {}  # top-level assignment target -> names its value reads
    used: set[str] = set()  # names read by every top-level statement but get_inputs and the assignments
    for node in tree.body:
        target, value = _single_assignment(node)
        if target is not None:
            assigned[target] = assigned.get(target, set()) | _names(value)
        elif isinstance(node, ast.FunctionDef) and node.name == "get_inputs":
            continue
        else:
            used |= _names(node)
    # a constant read by a used assignment is used too (transitively)
    todo = [n for n in used if n in assigned]
    while todo:
        n = todo.pop()
        for dep in assigned.get(n, ()):
            if dep not in used:
                used.add(dep)
                todo.append(dep)
    return {c for c in constants if c not in used}


def with_sizes(code: str, sizes: dict[str, int], name: str = "<task>") -> str:
    """``code`` with the top-level assignment of each name in ``sizes`` given the new value; every other byte
    of the source is kept.

    Raises:
        TaskFormatError: the source does not parse or misses a required definition.
        KeyError: a name of ``sizes`` is not a size constant of the source.
    """
    tree = check_source(code, name)
    lines = code.splitlines(keepends=True)
    spans = []
    for node in tree.body:
        target, value = _single_assignment(node)
        if target in sizes and isinstance(value, ast.Constant) and type(value.value) is int:
            spans.append((value.lineno, value.col_offset, value.end_lineno, value.end_col_offset, target))
    missing = set(sizes) - {s[-1] for s in spans}
    if missing:
        raise KeyError(f"{name}: no size constant {', '.join(sorted(missing))}")
    # splice from the end so earlier offsets stay valid; ast offsets are UTF-8 byte offsets within a line
    for line, col, end_line, end_col, target in sorted(spans, reverse=True):
        if line != end_line:
            raise KeyError(f"{name}: the constant {target} spans several lines")
        raw = lines[line - 1].encode()
        lines[line - 1] = (raw[:col] + str(int(sizes[target])).encode() + raw[end_col:]).decode()
    return "".join(lines)


class VariantFormatError(ValueError):
    """A ``shape_variants`` cell is not a JSON list of ``{"sizes": {name: positive int}}``; the message says
    where."""


def parse_variants(value, where: str = "shape_variants") -> list[dict]:
    """The variants of a published ``shape_variants`` cell (``compose.variants``): a JSON string or a list;
    None, NaN or an empty string give [].

    Raises:
        VariantFormatError: not JSON, or not a list of ``{"sizes": {name: positive int}, ...}`` objects.
    """
    import json
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value):
        return []
    items = value
    if isinstance(value, str):
        try:
            items = json.loads(value)
        except json.JSONDecodeError as exc:
            raise VariantFormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(items, list):
        raise VariantFormatError(f"{where}: expected a JSON list, got {type(items).__name__}")
    for i, v in enumerate(items):
        sizes = v.get("sizes") if isinstance(v, dict) else None
        if not isinstance(sizes, dict) or not sizes or not all(
                isinstance(k, str) and type(n) is int and n > 0 for k, n in sizes.items()):
            raise VariantFormatError(f"{where}[{i}]: expected {{'sizes': {{name: positive int}}}}, got {v!r}")
    return list(items)
