"""Figures of "tasks worth optimizing" on a GPU run's published rows (opforge issue on worthwhile tasks).

    python benchmarks/worthwhile_report.py RUN_DIR [--reference OPS6K.parquet] [--out FILE.json]

Reads RUN_DIR/hf (the published rows, with the ``roofline_ms`` / ``fusion_gain`` / ``eager_ms`` / ``compile_ms``
/ ``provenance`` columns) and RUN_DIR's funnel, and reports:

* fusion gain p10 / p50 / p90 and the share below 1.1 (``task.roofline``: per-op roofline sum over one ideal
  fused kernel, H200 datasheet peaks);
* room: ``min(eager_ms, compile_ms) / roofline_ms`` (what a perfect kernel has over the better of eager and
  torch.compile) p10 / p50 / p90 and the share >= 2;
* heavy-op share: rows that call a GEMM, convolution, attention or recurrent op (``opforge.task.realism``'s
  classes, traced on meta);
* axis misuse share (``task.axis_misuse``: softmax, scans, sort, topk or arg-reductions over the batch axis,
  flattened rolls);
* sources (motif / block / random composer) and the funnel's ``runtime_out_of_window`` rejections below the
  window (``too_fast``) out of all candidates;
* ``accepted_pool``: every accepted task's room (the filter's ``eager_ms`` / ``compile_ms`` / ``roofline_ms``)
  and heavy class, and what a ``min_room`` rule (reject when room < the value) would keep of it: share kept,
  room >= 2 share, fusion gain p50 and share below 1.1, heavy-op share, per motif category (the benchmark
  behind the ``headroom`` filter's ``min_room``).

With ``--reference`` the same static figures (fusion gain, heavy share, axis misuse) of a sample of another
dataset's rows (e.g. CUDA-Agent-Ops-6K) are reported beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _static(code: str) -> dict:
    import warnings

    warnings.simplefilter("ignore")
    from opforge.task.axis_misuse import axis_misuse
    from opforge.task.realism import is_heavy
    from opforge.task.roofline import roofline
    from opforge.task.source import load_task
    from opforge.task.trace import trace_task

    out: dict = {}
    try:
        r = roofline(code)
        out["fusion_gain"], out["roofline_ms"] = r.fusion_gain, r.roofline_ms
    except Exception as exc:  # noqa: BLE001 - a row the tracer cannot run on meta
        out["roofline_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    try:
        ops = trace_task(load_task(code, "row"))
        out["heavy"] = any(is_heavy(c) for op in ops for c in op.canonical)
    except Exception as exc:  # noqa: BLE001
        out["trace_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    try:
        check = axis_misuse(code)
        out["axis_misuse"] = check.misused
        out["axis_reason"] = check.reason
    except Exception as exc:  # noqa: BLE001
        out["axis_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return out


def _pcts(values) -> dict:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if not len(v):
        return {}
    return {"n": int(len(v)), "p10": round(float(np.percentile(v, 10)), 3), "p50": round(float(np.median(v)), 3),
            "p90": round(float(np.percentile(v, 90)), 3)}


def static_records(codes: list[str], workers: int, known: dict[str, dict] | None = None) -> list[dict]:
    """``_static`` of each code, in order; codes already in ``known`` (code -> record) are not measured again,
    and the new records are added to it."""
    known = {} if known is None else known
    todo = list(dict.fromkeys(c for c in codes if c not in known))
    if todo:
        with ProcessPoolExecutor(workers) as ex:
            known.update(zip(todo, ex.map(_static, todo, chunksize=4), strict=True))
    return [known[c] for c in codes]


def static_figures(codes: list[str], workers: int, known: dict[str, dict] | None = None) -> dict:
    recs = static_records(codes, workers, known)
    gains = [r.get("fusion_gain") for r in recs]
    heavy = [r["heavy"] for r in recs if "heavy" in r]
    axis = [r["axis_misuse"] for r in recs if r.get("axis_misuse") is not None]
    fg = [g for g in gains if g is not None]
    return {"rows": len(codes), "fusion_gain": {**_pcts(fg), "share_below_1_1": round(float(np.mean(
        [g < 1.1 for g in fg])), 4) if fg else None},
        "heavy_op_share": round(float(np.mean(heavy)), 4) if heavy else None, "heavy_traced": len(heavy),
        "axis_misuse_share": round(float(np.mean(axis)), 4) if axis else None, "axis_checked": len(axis),
        "axis_reasons": Counter(r["axis_reason"].split(" (")[0] for r in recs if r.get("axis_misuse")).most_common(8),
        "errors": Counter((r.get("roofline_error") or r.get("trace_error") or r.get("axis_error") or "")[:60]
                          for r in recs if "roofline_error" in r or "trace_error" in r or "axis_error" in r
                          ).most_common(5)}


ROOM_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5)


def _category(provenance: str | None) -> str:
    """A candidate's motif category, or ``block`` / ``random`` for the other composers."""
    p = json.loads(provenance) if provenance else {}
    return p.get("category") or ("block" if p.get("block") else "random")


def accepted_pool(run_dir: Path, workers: int, known: dict[str, dict] | None = None) -> dict:
    """Room and heavy class of every accepted task of ``run_dir`` (``filter/verdicts.parquet`` joined to the
    candidates' code), and what each ``min_room`` of ``ROOM_GRID`` keeps of them; the codes' ``_static``
    records go into ``known`` (``static_records``)."""
    verdicts = pd.read_parquet(run_dir / "filter" / "verdicts.parquet")
    rounds = sorted((run_dir / "candidates").glob("*.parquet"))
    # without the round files (a copy that left them out), the filtered candidates: "drawn" then leaves out the
    # candidates not filtered (full signatures, heavy-cap rounds)
    cands = (pd.concat([pd.read_parquet(p) for p in rounds], ignore_index=True) if rounds
             else pd.read_parquet(run_dir / "candidates.parquet")).drop_duplicates("task_id")
    acc = verdicts[verdicts["accepted"]].merge(cands[["task_id", "code", "provenance"]], on="task_id")
    best = np.minimum(pd.to_numeric(acc["eager_ms"], errors="coerce"),
                      pd.to_numeric(acc["compile_ms"], errors="coerce").fillna(np.inf))
    acc["room"] = best / pd.to_numeric(acc["roofline_ms"], errors="coerce")
    acc["heavy"] = [r.get("heavy") for r in static_records(list(acc["code"]), workers, known)]
    acc["category"] = [_category(t) for t in acc["provenance"]]
    # per category: candidates drawn, accepted, and kept by min_room 2 (compose.motifs.library.CATEGORY_YIELD)
    cands["category"] = [_category(t) for t in cands["provenance"]]
    kept_ids = set(acc.loc[acc["room"] >= 2, "task_id"])
    draws = {}
    for cat, g in cands.groupby("category"):
        n_acc = int(g["task_id"].isin(set(acc["task_id"])).sum())
        n_kept = int(g["task_id"].isin(kept_ids).sum())
        draws[cat] = {"drawn": len(g), "accepted": n_acc, "kept_min_room_2": n_kept,
                      "yield_min_room_2": round(n_kept / len(g), 3)}
    acc = acc[acc["room"].notna()]
    grid = {}
    for t in ROOM_GRID:
        k = acc[acc["room"] >= t]
        grid[f"min_room {t}"] = {
            "kept": len(k), "kept_share": round(len(k) / max(1, len(acc)), 4),
            "room_ge_2": round(float((k["room"] >= 2).mean()), 4) if len(k) else None,
            "fusion_gain_p50": round(float(k["fusion_gain"].median()), 3) if len(k) else None,
            "fusion_gain_below_1_1": round(float((k["fusion_gain"] < 1.1).mean()), 4) if len(k) else None,
            "heavy_share": round(float(k["heavy"].dropna().astype(bool).mean()), 4) if len(k) else None}
    by_cat = {}
    for (cat, heavy), g in acc.groupby(["category", acc["heavy"].fillna(False).astype(bool)]):
        by_cat[f"{cat} ({'heavy' if heavy else 'no heavy op'})"] = {
            "n": len(g), "room_p50": round(float(g["room"].median()), 3),
            "room_ge_2": round(float((g["room"] >= 2).mean()), 3)}
    return {"accepted": len(acc), "room": _pcts(acc["room"]), "grid": grid,
            "draws_by_category": dict(sorted(draws.items(), key=lambda kv: -kv[1]["drawn"])),
            "by_category": dict(sorted(by_cat.items(), key=lambda kv: -kv[1]["n"]))}


def main(argv=None) -> None:
    import record

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--reference", type=Path, default=None)
    ap.add_argument("--reference-n", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    shards = sorted((a.run_dir / "hf" / "data").glob("*.parquet"))
    rows = pd.concat([pd.read_parquet(s) for s in shards], ignore_index=True)
    res: dict = {"run_dir": str(a.run_dir), "rows": len(rows)}
    res["gpu"] = sorted(rows["gpu"].dropna().unique().tolist()) if "gpu" in rows else []
    fg = pd.to_numeric(rows.get("fusion_gain"), errors="coerce")
    res["fusion_gain_column"] = {**_pcts(fg), "share_below_1_1": round(float((fg < 1.1).mean()), 4)}
    room = np.minimum(pd.to_numeric(rows["eager_ms"], errors="coerce"),
                      pd.to_numeric(rows["compile_ms"], errors="coerce").fillna(np.inf)) / \
        pd.to_numeric(rows["roofline_ms"], errors="coerce")
    res["room"] = {**_pcts(room), "share_ge_2": round(float((room >= 2).mean()), 4)}
    res["compile_speedup"] = _pcts(pd.to_numeric(rows["eager_ms"], errors="coerce")
                                   / pd.to_numeric(rows["compile_ms"], errors="coerce"))
    res["eager_ms"] = _pcts(pd.to_numeric(rows["eager_ms"], errors="coerce"))
    kinds = Counter()
    cats = Counter()
    for text in rows.get("provenance", pd.Series([""] * len(rows))):
        p = json.loads(text) if text else {}
        kind = "motif" if p.get("motif_id") else ("block" if p.get("block") else "random")
        kinds[kind] += 1
        if kind == "motif":
            cats[p.get("category")] += 1
    res["sources"] = dict(kinds)
    res["motif_categories"] = dict(cats.most_common())
    res["data_source"] = rows["data_source"].value_counts().sort_index().to_dict()
    funnel_path = a.run_dir / "filter" / "funnel.json"
    if funnel_path.exists():
        funnel = json.loads(funnel_path.read_text())
        detail = funnel.get("by_reason_detail") or {}
        res["funnel"] = {"candidates": funnel.get("unique_tasks"), "accepted": funnel.get("accepted_tasks"),
                         "too_fast": sum(v for k, v in detail.items() if k.startswith("runtime_out_of_window")
                                         and "fast" in k),
                         "by_reason": funnel.get("by_reason"),
                         "detail": dict(sorted(detail.items(), key=lambda kv: -kv[1])[:20])}
    known: dict[str, dict] = {}  # the published rows are accepted tasks: each code is measured once
    if (a.run_dir / "filter" / "verdicts.parquet").exists():
        res["accepted_pool"] = accepted_pool(a.run_dir, a.workers, known)
    res["static"] = static_figures(list(rows["code"]), a.workers, known)
    if a.reference is not None and a.reference.exists():
        ref = pd.read_parquet(a.reference)
        ref = ref.sample(min(a.reference_n, len(ref)), random_state=0)
        res["reference"] = {"path": a.reference.name, **static_figures(list(ref["code"]), a.workers)}
    text = json.dumps(res, indent=1, default=str)
    if a.out:
        record.write_file(a.out, res)
    print(text)


if __name__ == "__main__":
    main()
