"""Blind read of two task datasets: a shuffled packet for a reader who does not know which row is whose.

``make_packet`` samples ``n`` rows of each dataset (any KernelBench-format Parquet / JSONL / Hub folder with a
``code`` column), strips comments and docstrings (``ast``: the source is re-printed, so layout and comment
style give nothing away), shuffles them under neutral ids (``R01``...) and writes:

* ``packet.md``: the reading instructions (``RUBRIC``) and the rows; this is all the reader sees;
* ``key.json``: id -> dataset label and row index (kept from the reader);
* ``judgments.template.json``: one ``{"sensible": null, "strong": null, "note": ""}`` per id to fill in.

``score`` reads the filled judgments with the key and reports, per dataset, the share judged sensible, strong
and both. Raises ``BlindReadError`` naming the file and id for a missing or malformed judgment.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

RUBRIC = """Each row below is a PyTorch task: a `Model` whose `forward` a kernel engineer would replace with
one or a few custom CUDA kernels. Judge every row on its own, on two questions:

- **sensible**: is this a plausible piece of a real model, or a reasonable kernel exercise? (No operations that
  make no sense in context: a softmax or sort over the batch, a norm over the wrong axis, special functions
  applied to arbitrary activations, parameters that are never used, values that saturate everything.)
- **strong**: is it a fusion worth writing a kernel for? (Several ops whose intermediates a fused kernel can
  keep on chip, or a memory-bound chain, rather than one big GEMM / convolution with a trivial epilogue that
  cuBLAS / cuDNN already does best.)

Answer each with true / false and a short note, in the judgments file, by row id."""


class BlindReadError(ValueError):
    """A packet, key or judgments file is missing or malformed; the message names the file and the id."""


def strip_source(code: str) -> str:
    """``code`` without comments and docstrings (re-printed by ``ast.unparse``). Raises ``SyntaxError``."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _rows(path: str) -> list[str]:
    """The ``code`` column of a task file, or of every Parquet shard of a Hub folder (``data/*.parquet``)."""
    import pandas as pd
    from opforge.task.task_file import read_tasks

    p = Path(path)
    if p.is_dir():
        shards = sorted(p.glob("data/*.parquet")) or sorted(p.glob("*.parquet"))
        if not shards:
            raise BlindReadError(f"{p}: no Parquet shards (data/*.parquet)")
        df = pd.concat([pd.read_parquet(s, columns=["code"]) for s in shards], ignore_index=True)
    else:
        df = read_tasks(p)
    return [str(c) for c in df["code"]]


def make_packet(datasets: dict[str, str], n: int, out: Path, seed: int = 0) -> Path:
    """Write the packet for ``datasets`` (label -> path), ``n`` rows each, to the folder ``out``; returns it.
    Rows that do not parse are skipped (and counted in the key). Raises ``BlindReadError`` when a dataset has
    fewer than ``n`` parseable rows."""
    rng = random.Random(seed)
    picked: list[tuple[str, int, str]] = []
    skipped = {}
    for label, path in datasets.items():
        codes = _rows(path)
        order = list(range(len(codes)))
        rng.shuffle(order)
        got, bad = [], 0
        for i in order:
            try:
                got.append((label, i, strip_source(codes[i])))
            except SyntaxError:
                bad += 1
            if len(got) == n:
                break
        if len(got) < n:
            raise BlindReadError(f"{path}: only {len(got)} parseable rows, {n} wanted")
        picked += got
        skipped[label] = bad
    rng.shuffle(picked)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = [f"R{k + 1:02d}" for k in range(len(picked))]
    lines = ["# Blind read", "", RUBRIC, ""]
    for rid, (_, _, code) in zip(ids, picked, strict=True):
        lines += [f"## {rid}", "", "```python", code, "```", ""]
    (out / "packet.md").write_text("\n".join(lines))
    key = {rid: {"dataset": label, "row": int(i)} for rid, (label, i, _) in zip(ids, picked, strict=True)}
    (out / "key.json").write_text(json.dumps({"key": key, "datasets": datasets, "n": n, "seed": seed,
                                              "unparseable_skipped": skipped}, indent=1))
    (out / "judgments.template.json").write_text(json.dumps(
        {rid: {"sensible": None, "strong": None, "note": ""} for rid in ids}, indent=1))
    return out


def score(folder: Path, judgments: Path) -> dict:
    """Per dataset: rows, sensible / strong / both counts and shares. Raises ``BlindReadError``."""
    folder = Path(folder)
    try:
        key = json.loads((folder / "key.json").read_text())["key"]
    except (OSError, ValueError, KeyError) as exc:
        raise BlindReadError(f"{folder / 'key.json'}: {exc}") from None
    try:
        judged = json.loads(Path(judgments).read_text())
    except (OSError, ValueError) as exc:
        raise BlindReadError(f"{judgments}: {exc}") from None
    out: dict[str, dict] = {}
    for rid, where in key.items():
        j = judged.get(rid)
        if not isinstance(j, dict) or not isinstance(j.get("sensible"), bool) or not isinstance(j.get("strong"), bool):
            raise BlindReadError(f"{judgments}: id {rid}: needs boolean 'sensible' and 'strong'")
        d = out.setdefault(where["dataset"], {"rows": 0, "sensible": 0, "strong": 0, "both": 0})
        d["rows"] += 1
        d["sensible"] += j["sensible"]
        d["strong"] += j["strong"]
        d["both"] += j["sensible"] and j["strong"]
    for d in out.values():
        for k in ("sensible", "strong", "both"):
            d[f"{k}_share"] = round(d[k] / d["rows"], 4) if d["rows"] else 0.0
    return out
