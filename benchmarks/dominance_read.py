"""The benchmark behind the ``trivial`` filter's heavy-op bound (``max_heavy_share``): how readers judged rows by
the share of the kernel time their top op takes, and what a bound would take out of GPU runs.

    python benchmarks/dominance_read.py --read BLIND_DIR=RUN_DIR [--read ...] [--run RUN_DIR ...]
        [--thresholds 0.5 0.6 0.7 0.8] [--name dominance_read]

``--read``: a filled blind-read folder (``opforge blind-read``: ``key.json`` and ``judgments.json``) whose
``ours`` rows are the published rows of the GPU run ``RUN_DIR`` (its ``hf/data/*.parquet`` in the packet's
order, and its ``filter/ledger.jsonl``, whose ``trivial`` metrics hold each task's ``top_share`` and
``top_op``: per-op CUDA-event kernel time of the traced graph). For every read and for all reads together it
reports how many of ``ours`` were judged strong (a fusion worth writing) per ``top_share`` band, and per
threshold how many rows a heavy-op bound would reject (the top op a GEMM, convolution, attention or recurrent
op, ``task.realism.is_heavy`` of ``task.op_names.label_op``, with ``top_share`` >= the threshold) and how many
of those and of the others were judged strong.

``--run`` (and every ``--read``'s run): per threshold, the share of the run's published rows and of its
accepted pool the bound rejects, and the kept published rows' convolution and heavy-op shares and fusion gain
p50, beside the run's own.

The packets themselves (they hold the reference dataset's rows) are not kept; their keys and judgments are the
input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.pipeline.select import heavy_flags
from opforge.task.op_names import label_op
from opforge.task.realism import CONV_PATTERN, is_heavy, op_labels

BANDS = ((0.0, 0.3), (0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 1.01))


def heavy_label(label) -> bool:
    """Whether a traced call's label (``Linear``, ``torch.conv2d``, ``@``) is a heavy op."""
    return isinstance(label, str) and bool(label) and is_heavy(label_op(label)) is not None


def ledger_dominance(run: Path) -> dict[str, dict]:
    """task_id -> {"accepted", "top_share", "top_op"} from ``RUN/filter/ledger.jsonl`` (cut lines skipped)."""
    out = {}
    with open(run / "filter" / "ledger.jsonl") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            t = (rec.get("metrics") or {}).get("trivial") or {}
            out[rec["task_id"]] = {"accepted": bool(rec.get("accepted")), "top_share": t.get("top_share"),
                                   "top_op": (t.get("top_op") or {}).get("op")}
    return out


def published(run: Path) -> pd.DataFrame:
    """The run's published rows in the order ``opforge blind-read`` numbers them (sorted shards)."""
    shards = sorted((run / "hf").glob("data/*.parquet"))
    if not shards:
        raise SystemExit(f"{run}/hf: no data/*.parquet")
    return pd.concat([pd.read_parquet(s) for s in shards], ignore_index=True)


def read_rows(blind: Path, run: Path) -> list[dict]:
    """The ``ours`` rows of one read: judged strong / sensible, top share and top op."""
    key = json.loads((blind / "key.json").read_text())["key"]
    judged = json.loads((blind / "judgments.json").read_text())
    judged = judged.get("rows", judged)
    pub, dom = published(run), ledger_dominance(run)
    rows = []
    for rid, where in sorted(key.items()):
        if where["dataset"] != "ours":
            continue
        task_id = pub.iloc[int(where["row"])]["task_id"]
        d = dom.get(task_id, {})
        rows.append({"id": rid, "strong": bool(judged[rid]["strong"]), "sensible": bool(judged[rid]["sensible"]),
                     "top_share": d.get("top_share"), "top_op": d.get("top_op")})
    return rows


def judged_figures(rows: list[dict], thresholds: list[float]) -> dict:
    bands = {}
    for lo, hi in BANDS:
        b = [r for r in rows if r["top_share"] is not None and lo <= r["top_share"] < hi]
        bands[f"{lo:.1f}-{min(hi, 1.0):.1f}"] = {"rows": len(b), "strong": sum(r["strong"] for r in b)}
    rules = {}
    for th in thresholds:
        out = [r for r in rows if r["top_share"] is not None and r["top_share"] >= th and heavy_label(r["top_op"])]
        kept = [r for r in rows if r not in out]
        rules[str(th)] = {"rejected": len(out), "rejected_strong": sum(r["strong"] for r in out),
                          "kept": len(kept), "kept_strong": sum(r["strong"] for r in kept),
                          "kept_strong_share": round(sum(r["strong"] for r in kept) / max(len(kept), 1), 4)}
    return {"rows": len(rows), "strong": sum(r["strong"] for r in rows),
            "without_top_share": sum(r["top_share"] is None for r in rows), "by_top_share": bands,
            "heavy_bound": rules}


def run_figures(run: Path, thresholds: list[float]) -> dict:
    dom, pub = ledger_dominance(run), published(run)
    top = pub["task_id"].map(lambda t: dom.get(t, {}).get("top_share"))
    op = pub["task_id"].map(lambda t: dom.get(t, {}).get("top_op"))
    conv = pub["ops"].map(lambda o: any(CONV_PATTERN.match(label_op(x)) for x in op_labels(o)))
    heavy = pd.Series(heavy_flags(pub))
    pool = [d for d in dom.values() if d["accepted"]]
    out = {"published": len(pub), "accepted_pool": len(pool), "conv_share": round(conv.mean(), 4),
           "heavy_share": round(heavy.mean(), 4), "fusion_gain_p50": round(float(pub["fusion_gain"].median()), 3),
           "bounds": {}}
    for th in thresholds:
        hit = top.ge(th).fillna(False) & op.map(heavy_label)
        kept = ~hit
        out["bounds"][str(th)] = {
            "published_rejected_share": round(hit.mean(), 4),
            "accepted_pool_rejected_share": round(sum((d["top_share"] or 0) >= th and heavy_label(d["top_op"])
                                                      for d in pool) / max(len(pool), 1), 4),
            "kept_conv_share": round(conv[kept].mean(), 4), "kept_heavy_share": round(heavy[kept].mean(), 4),
            "kept_fusion_gain_p50": round(float(pub.loc[kept, "fusion_gain"].median()), 3)}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--read", action="append", default=[], help="BLIND_DIR=RUN_DIR")
    ap.add_argument("--run", action="append", default=[], help="RUN_DIR (published rows and ledger)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8])
    ap.add_argument("--name", default="dominance_read", help="result file name (results/<machine>/NAME.json)")
    a = ap.parse_args(argv)
    reads, runs, every = {}, {}, []
    for spec in a.read:
        blind, _, run = spec.partition("=")
        rows = read_rows(Path(blind), Path(run))
        every += rows
        reads[blind] = {"run": run, **judged_figures(rows, a.thresholds)}
        runs[run] = run_figures(Path(run), a.thresholds)
    for run in a.run:
        runs[run] = run_figures(Path(run), a.thresholds)
    out = {"benchmark": "blind-read strong judgments by the top op's share of the kernel time, and the heavy-op "
                        "bound's rejections on GPU runs", "thresholds": a.thresholds, "reads": reads,
           "all_reads": judged_figures(every, a.thresholds), "runs": runs}
    print(json.dumps(out["all_reads"], indent=1))
    print("wrote", record.write(a.name, out))


if __name__ == "__main__":
    main()
