"""Two KernelBench-format datasets side by side (``opforge compare A B``): rows, distinct ops, label fidelity,
duplicates, KernelBench signature hits, fusion headroom, axis misuse, dtypes and the realism figures.

Library use::

    result = compare("runs/ops/hf", "cuda_agent_ops_6k.parquet", workers=2, limit=500)
    json_path, md_path = write_compare(result, "runs/compare")     # compare.json, compare.md
    print(markdown_table(result["table"], result["names"]))

A and B are each a dataset folder (rows in ``data/*.parquet``, e.g. ``RUN_DIR/hf`` written by ``opforge run``),
a Parquet file or a JSONL file (``opforge.task.realism.read_rows``). Only ``code`` is required; ``ops``,
``data_source``, ``task_id`` and ``dtype`` are used when present. The result holds one block per dataset under
``datasets.a`` / ``datasets.b`` and the table (measure | A | B) under ``table``.

Every measure is computed by the same code for both datasets, with opforge's own functions.

Over all rows (cheap):

* **labels**: a row's labels are ``realism.op_labels(ops)``; torch rows are those whose ``data_source``
  is not ``transformers``. Distinct op labels, signatures (sorted label sets) and sequences are counted over
  torch rows, distinct transformers modules over transformers rows (an Ops-6K label ``Name_k`` counts as
  ``Name``); ``max_rows_per_signature`` is the largest number of torch rows sharing one signature. Shares
  per op count (number of labels, 1..5 and ``>5``) are over torch rows, shares per ``data_source`` over all
  rows.
* **duplicates within a dataset**: the ``duplicate`` filter's verdicts over the dataset in row order
  (``filters.duplicate.DuplicateFilter`` with its default thresholds): ``exact`` = equal normalised
  source, ``near`` = MinHash Jaccard >= ``near_min`` (0.9) with the same source-read op signature.
* **cross-dataset duplicates**: per row of A, ``exact`` when its normalised-source hash equals a row of B's,
  else ``near`` when the duplicate rule's nearest row of B (``filters.duplicate.NearIndex`` over every row
  of B) reaches ``near_min``. For a release compared with Ops-6K, exact must be 0.
* **declared dtype**: shares of the ``dtype`` column, when the dataset has one.

Over a sample of ``limit`` rows per dataset (``random.Random(seed).sample`` of the row numbers, the same
seed for both; all rows without a limit), one worker process per ``workers``, each row with a wall-clock
limit of ``timeout_s`` and an address-space margin of ``memory_gib`` (``seeds.probe_pool.memory_bound``); a
row that runs out of time or kills its worker is counted as untraced with that reason, never stops the run:

* **label fidelity**, traced on the ``meta`` device (``compose.labels``: ``task.trace.trace_task``, shapes
  only, so published sizes cost no memory or compute); a row whose trace fails on ``meta`` (an op with no
  meta kernel, e.g. ``masked_select``, ``nonzero``) is traced again on the CPU with real tensors when its
  inputs, measured on ``meta``, total at most ``cpu_fallback_mb`` MB, else it is untraced with the
  error as reason. Rules, over traced rows:

  - torch rows, ``exact_sequence``: ``compose.labels.labels_match`` - the traced calls are exactly the
    listed labels, one per call, in order (the invariant of a published opforge row, DESIGN.md §2);
  - torch rows, ``same_set``: every listed label is a spelling of a traced call and every traced call has
    a spelling among the labels (order and multiplicity ignored);
  - torch rows, ``all_listed_called``: every listed label is a spelling of a traced call;
  - torch rows, ``all_listed_computed``: every listed label is a spelling of a traced call or its
    canonical op name (``seeds.public_api.label_canonical``: ``F.softplus`` = ``nn.Softplus`` =
    ``softplus``) is one the forward computes (``task.trace.op_signature``, names merged by
    ``seeds.public_api.merged_canonical``); DESIGN.md §6's "~9 % of Ops-6K rows list an op their code does
    not call";
  - transformers rows, ``module_present``: the label (Ops-6K's ``Name_k`` read as ``Name``) is the class
    name of a module of the model built from ``get_init_inputs()``. Ops-6K's ``Model`` is the module
    itself renamed, so its rows fail this rule by construction: the figure is reported, not compared;
  - ``label_fidelity`` (the headline): ``exact_sequence`` over traced torch rows.
* **KernelBench signature hits**: the ``contamination`` filter's score of the row
  (``filters.contamination.ContaminationFilter`` with default thresholds, reference ``kernelbench`` or
  the filter's default): a hit is a row with a non-empty ``signature_matches`` (its canonical op set,
  traced on ``meta``, else read from the source, equals a problem's). The filter's verdict counts (any
  tier) are reported too.
* **fusion headroom**: ``task.roofline.roofline`` of the row on ``meta`` at the datasheet peaks ``peaks``
  (``task.peaks``, H200 SXM by default): ``fusion_gain = per_op_ms / roofline_ms``, what fusing the task can
  win at best. Reported: p10 / p50 / p90 over measured rows (``numpy.percentile``, linear interpolation)
  and the share of measured rows with ``fusion_gain < 1.1`` (issue #38's "<= 10 % of rows below 1.1");
  rows the roofline cannot trace are counted by error.
* **axis misuse**: ``task.axis_misuse.axis_misuse`` (an axis-wise op over the batch axis, or a ``roll``
  without dims); the share of misused rows among the rows whose forward ran twice on ``meta``, and among
  all sampled rows; misuses counted by op (the first word of each reason).
* **realism and dtypes**: ``realism.measure_row`` per row and ``realism.summarise`` / ``check_targets``
  over the sample (batch, largest non-batch dim, heavy-op share, low-precision share, input bytes...).
  A row's dtype is ``bfloat16`` / ``float16`` when an input, parameter or buffer has that dtype, else
  ``float32`` / ``float64`` likewise, else ``none`` (no floating tensor), ``unknown`` when it did not build.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import platform
import random
import re
import socket
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opforge.task import realism

MEASURE_VERSION = 2
FINGERPRINT_CHUNK = 250  # rows per fingerprint job
LOW_GAIN = 1.1  # fusion gain below which a task leaves little to fuse (issue #38: <= 10 % of rows below 1.1)
_OPS6K_SUFFIX = re.compile(r"_\d+$")  # Ops-6K spells a transformers module ``Name_k``


class CompareInputError(ValueError):
    """An input dataset cannot be compared; the message names the path and the problem."""


# ---------------------------------------------------------------------------------------------------------
# input


def read_dataset(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a dataset folder (``data/*.parquet``), a Parquet or a JSONL file, as dicts with ``row``
    (position), ``code`` and, when present, ``task_id``, ``ops``, ``data_source``, ``dtype`` (strings or None).

    Raises:
        CompareInputError: missing path, no ``data/*.parquet``, unreadable file or no ``code`` column.
    """
    path = Path(path)
    try:
        rows = realism.read_rows(path)
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise CompareInputError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    for i, row in enumerate(rows):
        row["row"] = i
        for key in ("ops", "data_source", "dtype", "task_id"):
            v = row.get(key)
            if v is not None and not isinstance(v, str):  # NaN / None from pandas
                row[key] = None if v != v else str(v)
    return rows


def dataset_name(path: str | Path) -> str:
    """The column title of a dataset: a run's ``hf`` folder by its run folder (``runs/ops/hf`` -> ``ops``), a
    file by its stem."""
    path = Path(path)
    return path.parent.name if path.name == "hf" and path.parent.name else path.stem


def sample_rows(n: int, limit: int | None, seed: int) -> list[int]:
    """Row numbers measured by the expensive passes: all ``n`` without ``limit``, else ``limit`` of them
    drawn by ``random.Random(seed).sample``, in row order."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def is_transformers(row: dict[str, Any]) -> bool:
    """Whether a row is a transformers module (``data_source == "transformers"``)."""
    return row.get("data_source") == "transformers"


def module_name_candidates(label: str) -> list[str]:
    """Class names a transformers row's label may stand for: the label, and for Ops-6K's ``Name_k`` also
    ``Name``."""
    out = [label]
    if _OPS6K_SUFFIX.search(label):
        out.append(_OPS6K_SUFFIX.sub("", label))
    return out


# ---------------------------------------------------------------------------------------------------------
# cheap measures over all rows


def label_measures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Label figures over all rows (rules in the module docstring): counts of distinct op labels,
    signatures, sequences and transformers modules, op-count shares, ``data_source`` and declared dtype
    shares (fractions in [0, 1])."""

    def module_name(row):  # a transformers row's module: Ops-6K's bare ``Name_k`` read as ``Name``
        labels = realism.op_labels(row.get("ops"))
        if not labels:
            return ""
        bare = not str(row.get("ops")).lstrip().startswith("[")
        return module_name_candidates(labels[0])[-1] if bare else labels[0]

    torch_labels = [realism.op_labels(r.get("ops")) for r in rows if not is_transformers(r)]
    out: dict[str, Any] = {
        "rows": len(rows),
        "distinct_op_labels": len({x for labels in torch_labels for x in labels}),
        "distinct_signatures": len({tuple(sorted(set(labels))) for labels in torch_labels}),
        "distinct_sequences": len({tuple(labels) for labels in torch_labels}),
        "transformers_modules": len({module_name(r) for r in rows if is_transformers(r)}),
    }
    torch_rows = torch_labels
    sigs = Counter(tuple(sorted(set(labels))) for labels in torch_rows)
    top = sigs.most_common(1)
    out["n_torch"] = len(torch_rows)
    out["n_transformers"] = len(rows) - len(torch_rows)
    out["max_rows_per_signature"] = top[0][1] if top else 0
    out["most_common_signature"] = list(top[0][0]) if top else None
    counts = Counter(min(len(labels), 6) for labels in torch_rows)
    out["op_count_share"] = {("" if k <= 5 else ">") + str(min(k, 5)): counts[k] / len(torch_rows)
                             for k in sorted(counts)} if torch_rows else {}
    sources = Counter(r.get("data_source") or "none" for r in rows)
    out["data_source_share"] = {k: v / len(rows) for k, v in sorted(sources.items())} if rows else {}
    declared = Counter(r["dtype"] for r in rows if r.get("dtype"))
    out["declared_dtype_share"] = ({k: v / len(rows) for k, v in sorted(declared.items())}
                                   if declared else None)
    return out


def duplicate_measures(rows: list[dict[str, Any]], fingerprints: list | None = None) -> dict[str, Any]:
    """The ``duplicate`` filter's verdicts over ``rows`` in row order (``fingerprints``: their
    ``filters.duplicate.fingerprint``, None for a non-string code; computed here when not given): counts
    and the first examples (row, reason, row it duplicates, Jaccard)."""
    from opforge.filters.duplicate import DuplicateFilter

    f = DuplicateFilter()
    verdicts = f.run_corpus([r["code"] for r in rows], fingerprints=fingerprints)
    reasons = Counter(v.reason for v in verdicts if not v.accepted)
    examples = [[i, v.reason, v.metrics.get("duplicate_of"), v.metrics.get("jaccard")]
                for i, v in enumerate(verdicts) if not v.accepted][:10]
    return {"exact": reasons.get("duplicate:exact", 0), "near": reasons.get("duplicate:near", 0),
            "near_min": f.thresholds["near_min"],
            "byte_identical": len(rows) - len({r["code"] for r in rows}),
            "examples": examples}


def cross_duplicates(a: list, b: list, near_min: float) -> dict[str, Any]:
    """Rows of A that are exact or near duplicates of a row of B (``a``, ``b``: lists of
    ``filters.duplicate.Fingerprint``, None for a non-string code, in row order). Returns counts and the
    first pairs ``[row of A, row of B(, Jaccard)]``."""
    from opforge.filters.duplicate import NearIndex

    keys = {}
    index = NearIndex()
    for j, fp in enumerate(b):
        if fp is not None:
            keys.setdefault(fp.exact_key, j)
            index.insert(j, fp)
    exact, near, jaccards = [], [], []
    for i, fp in enumerate(a):
        if fp is None:
            continue
        if fp.exact_key in keys:
            exact.append([i, keys[fp.exact_key]])
            continue
        best, jac = index.nearest(fp)
        if best is not None:
            jaccards.append(jac)
            if jac >= near_min:
                near.append([i, best, round(jac, 4)])
    return {"exact": len(exact), "near": len(near), "near_min": near_min,
            "with_a_same_signature_candidate": len(jaccards),
            "exact_pairs": exact[:20], "near_pairs": sorted(near, key=lambda p: -p[2])[:20]}


# ---------------------------------------------------------------------------------------------------------
# worker side: one row


def _init_worker() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # tracing runs on meta / CPU; no CUDA context
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import warnings

    import opforge.compose.labels  # noqa: F401 - imported once, not inside the first row's time limit
    import opforge.filters.contamination  # noqa: F401
    import opforge.task.axis_misuse  # noqa: F401
    import opforge.task.roofline  # noqa: F401
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)


def fingerprint_chunk(codes: list[Any]) -> list[Any]:
    """Worker: ``filters.duplicate.fingerprint`` of each code (None for a non-string)."""
    from opforge.filters.duplicate import fingerprint

    return [fingerprint(c) if isinstance(c, str) else None for c in codes]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _fidelity_on(row: dict[str, Any], labels: list[str], device: str) -> dict[str, Any]:
    """Fidelity rules (module docstring) of one row traced on ``device``; raises what tracing raises."""
    import torch
    from opforge.compose.labels import labels_match
    from opforge.seeds.public_api import label_canonical, merged_canonical
    from opforge.task.source import load_task
    from opforge.task.trace import op_signature, trace_task

    name = str(row.get("task_id") or f"row{row['row']}")
    if is_transformers(row):
        task = load_task(row["code"], name)
        with torch.device(device):
            model = task.build()
        classes = {type(m).__name__ for m in model.modules()}
        ok = bool(labels) and any(c in classes for c in module_name_candidates(labels[0]))
        return {"device": device, "kind": "transformers", "module_present": ok}
    ops = trace_task(load_task(row["code"], name), device=device)
    traced = [op.labels for op in ops]  # what compose.labels.recovered_labels returns
    exact = labels_match(row["code"], labels, name, device)
    spellings = {s for alts in traced for s in alts}
    listed_called = all(lab in spellings for lab in labels)
    canonical = {merged_canonical(c) for c in op_signature(ops)}
    return {"device": device, "kind": "torch", "exact_sequence": exact, "all_listed_called": listed_called,
            "same_set": listed_called and all(any(s in labels for s in alts) for alts in traced),
            "all_listed_computed": all(lab in spellings or label_canonical(lab) in canonical for lab in labels),
            "traced": [alts[0] if len(alts) == 1 else list(alts) for alts in traced][:12]}


def label_fidelity(row: dict[str, Any], input_bytes: int | None, cpu_fallback_bytes: int) -> dict[str, Any]:
    """Fidelity of one row: on ``meta``, else on the CPU when its inputs are at most ``cpu_fallback_bytes``
    (``input_bytes`` measured on meta). Returns the rules' booleans, or ``{"untraced": reason}``."""
    labels = realism.op_labels(row.get("ops"))
    try:
        return _fidelity_on(row, labels, "meta")
    except (Exception, SystemExit) as exc:
        meta_error = _error(exc)
    if input_bytes is None or input_bytes > cpu_fallback_bytes:
        return {"untraced": f"meta: {meta_error}"}
    try:
        return {**_fidelity_on(row, labels, "cpu"), "meta_error": meta_error}
    except (Exception, SystemExit) as exc:
        return {"untraced": f"meta: {meta_error}; cpu: {_error(exc)}"}


def kernelbench_check(row: dict[str, Any], index_path: str) -> dict[str, Any]:
    """The contamination filter's score and verdict of one row against the index saved at ``index_path``."""
    from opforge.filters.contamination import ContaminationFilter
    from opforge.filters.kernelbench import load_index
    from opforge.filters.verdict import TaskInput

    f = ContaminationFilter(load_index(index_path))
    try:
        m = f.score(TaskInput(code=row["code"], task_id=str(row.get("task_id") or f"row{row['row']}")))
    except (Exception, SystemExit) as exc:
        return {"error": _error(exc)}
    v = f.decide(m)
    return {"signature_hit": bool(m["signature_matches"]), "signature_matches": m["signature_matches"][:3],
            "signature_source": m["signature_source"], "verdict": v.reason or "accepted",
            "nearest": m["kernelbench_nearest"], "similarity": m["kernelbench_similarity"]}


def headroom_check(row: dict[str, Any], peaks: str) -> dict[str, Any]:
    """``task.roofline.roofline`` of one row at the named datasheet peaks: ``fusion_gain`` (per-op ms over
    fused ms, >= 1), ``roofline_ms`` and ``bound``, or ``{"error": ...}`` when it cannot be traced on meta."""
    from opforge.task.peaks import get_peaks
    from opforge.task.roofline import roofline

    try:
        r = roofline(row["code"], get_peaks(peaks), name=str(row.get("task_id") or f"row{row['row']}"))
    except (Exception, SystemExit) as exc:
        return {"error": _error(exc)}
    return {"fusion_gain": r.fusion_gain, "roofline_ms": r.roofline_ms, "bound": r.bound}


def axis_check(row: dict[str, Any]) -> dict[str, Any]:
    """``task.axis_misuse.axis_misuse`` of one row: ``misused`` (True / False, None when untraced) and its
    reasons."""
    from opforge.task.axis_misuse import axis_misuse

    check = axis_misuse(row["code"], str(row.get("task_id") or f"row{row['row']}"))
    return {"misused": check.misused, "reasons": check.reasons[:5]}


def measure_task(row: dict[str, Any], index_path: str, memory_bytes: int, cpu_fallback_bytes: int,
                 peaks: str = "h200") -> dict:
    """Worker: realism record, label fidelity, KernelBench check, fusion headroom and axis misuse of one
    row, under the memory bound (bytes)."""
    from opforge.seeds.probe_pool import memory_bound

    with memory_bound(memory_bytes):
        rec = realism.measure_row(row)
        fid = label_fidelity(row, rec.get("input_bytes"), cpu_fallback_bytes)
        kb = kernelbench_check(row, index_path)
        head = headroom_check(row, peaks)
        axis = axis_check(row)
    return {"realism": rec, "fidelity": fid, "kernelbench": kb, "headroom": head, "axis": axis}


# ---------------------------------------------------------------------------------------------------------
# parent side


def _failed_record(row: dict[str, Any], reason: str) -> dict[str, Any]:
    rec = realism.measure_static(row)
    rec.update(status=reason_kind(reason), error=reason)
    return {"realism": rec, "fidelity": {"untraced": reason}, "kernelbench": {"error": reason},
            "headroom": {"error": reason}, "axis": {"misused": None, "reasons": [reason]}}


def run_pool(jobs: dict[str, tuple[list[dict], list[int]]], index_path: str, workers: int, timeout_s: float,
             memory_gib: float, cpu_fallback_mb: float, progress: bool,
             peaks: str = "h200") -> tuple[dict[str, list], dict[str, list]]:
    """Fingerprint every row and measure the sampled rows of each dataset in ``workers`` spawned processes.

    Args:
        jobs: dataset name -> (rows, sampled row numbers).
        index_path: the KernelBench index saved by ``filters.kernelbench.cached_index``.
        timeout_s: per-row limit (s); memory_gib: address-space margin per row (GiB); cpu_fallback_mb: the
            label-fidelity CPU fallback's input limit (MB); peaks: ``task.peaks`` name of the roofline.

    Returns:
        (fingerprints per dataset in row order, per-row ``measure_task`` records per dataset in sample
        order). A row past ``timeout_s`` or whose worker died gets an
        untraced record naming why (``timeout (...)``, ``crash:SIGKILL (...)``, ``pool_error (...)``).
    """
    from concurrent.futures import TimeoutError as FutureTimeout
    from concurrent.futures import as_completed

    from opforge.seeds.probe_pool import crash_reason
    from pebble import ProcessExpired, ProcessPool
    from tqdm.auto import tqdm

    memory_bytes = int(memory_gib * 2**30)
    fallback = int(cpu_fallback_mb * 1e6)
    pool = ProcessPool(max_workers=workers, initializer=_init_worker,
                       context=multiprocessing.get_context("spawn"))
    futures: dict[Any, tuple[str, str, int]] = {}
    try:
        for name, (rows, sample) in jobs.items():
            for start in range(0, len(rows), FINGERPRINT_CHUNK):
                chunk = [r["code"] for r in rows[start:start + FINGERPRINT_CHUNK]]
                futures[pool.schedule(fingerprint_chunk, (chunk,), timeout=max(timeout_s, 600))] = \
                    (name, "fp", start)
            for k, i in enumerate(sample):
                futures[pool.schedule(measure_task, (rows[i], index_path, memory_bytes, fallback, peaks),
                                      timeout=timeout_s)] = (name, "row", k)
        fps = {name: [None] * len(rows) for name, (rows, _) in jobs.items()}
        recs = {name: [None] * len(sample) for name, (_, sample) in jobs.items()}
        n_rows = sum(len(s) for _, s in jobs.values())
        bar = tqdm(total=n_rows, desc="trace", unit="task", disable=not progress)
        for fut in as_completed(futures):
            name, kind, pos = futures[fut]
            rows, sample = jobs[name]
            try:
                result, reason = fut.result(), None
            except FutureTimeout:
                result, reason = None, f"timeout (no result within {timeout_s:g} s)"
            except ProcessExpired as exc:
                result, reason = None, f"{crash_reason(exc.exitcode)} (worker died)"
            except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result: still a record
                result, reason = None, f"pool_error ({_error(exc)})"
            if kind == "fp":
                if result is None:  # fingerprinting is plain Python: redo it here rather than lose rows
                    result = fingerprint_chunk([r["code"] for r in rows[pos:pos + FINGERPRINT_CHUNK]])
                fps[name][pos:pos + len(result)] = result
            else:
                recs[name][pos] = result if result is not None else _failed_record(rows[sample[pos]], reason)
                bar.update(1)
        bar.close()
    finally:
        pool.stop()
        pool.join()
    return fps, recs


def row_dtype(rec: dict[str, Any]) -> str:
    """Dtype class of one realism record (module docstring)."""
    if rec.get("input_dtypes") is None or rec.get("param_dtypes") is None:
        return "unknown"
    seen = {*rec["input_dtypes"], *rec["param_dtypes"]}
    for dtype in ("bfloat16", "float16", "float32", "float64"):
        if dtype in seen:
            return dtype
    return "none"


def reason_kind(reason: str) -> str:
    """The kind of an untraced row's reason: ``timeout`` / ``crash:SIGKILL`` / ``pool_error`` for the pool's,
    the exception type for a failed trace (``meta: NotImplementedError: ...`` -> ``NotImplementedError``)."""
    if reason.startswith(("timeout (", "crash:", "pool_error (")):
        return reason.split(" (")[0]
    return reason.removeprefix("meta: ").split(":")[0]


def _share(n: int, d: int) -> float | None:
    return n / d if d else None


def _quantiles(values: list[float]) -> dict[str, float] | None:
    import numpy as np

    if not values:
        return None
    return {f"p{q}": round(float(np.percentile(values, q)), 4) for q in (10, 50, 90)}


def headroom_measures(sample: list[int], heads: list[dict[str, Any]]) -> dict[str, Any]:
    """Fusion-headroom figures of the sampled rows (``headroom_check`` records in sample order):
    ``fusion_gain`` p10 / p50 / p90, ``share_below_1.1`` (fraction of measured rows with a gain below
    ``LOW_GAIN``), ``n_measured`` and the untraced rows counted by error kind."""
    gains = [h["fusion_gain"] for h in heads if "fusion_gain" in h]
    errors = [(sample[k], h["error"]) for k, h in enumerate(heads) if "error" in h]
    return {"n_sampled": len(heads), "n_measured": len(gains), "fusion_gain": _quantiles(gains),
            f"share_below_{LOW_GAIN:g}": _share(sum(g < LOW_GAIN for g in gains), len(gains)),
            "roofline_ms": _quantiles([h["roofline_ms"] for h in heads if "roofline_ms" in h]),
            "compute_bound_share": _share(sum(h.get("bound") == "compute" for h in heads), len(gains)),
            "n_untraced": len(errors),
            "untraced_reasons": [list(kv) for kv in Counter(reason_kind(e) for _, e in errors).most_common(5)]}


def axis_measures(sample: list[int], axes: list[dict[str, Any]]) -> dict[str, Any]:
    """Axis-misuse figures of the sampled rows (``axis_check`` records in sample order): misused rows,
    their share of the traced rows and of all sampled rows, misuses by op and the first examples."""
    traced = [a for a in axes if a["misused"] is not None]
    misused = [(sample[k], a["reasons"]) for k, a in enumerate(axes) if a["misused"]]
    by_op = Counter(why.split(" ")[0] for _, reasons in misused for why in reasons)
    return {"n_sampled": len(axes), "n_traced": len(traced), "misused": len(misused),
            "share_of_traced": _share(len(misused), len(traced)), "share_of_all": _share(len(misused), len(axes)),
            "misuses_by_op": dict(by_op.most_common()), "examples": [list(m) for m in misused[:10]]}


def sample_measures(rows: list[dict[str, Any]], sample: list[int], recs: list[dict]) -> dict[str, Any]:
    """Fidelity, KernelBench, fusion headroom, axis misuse, dtype and realism figures of the sampled rows
    (rules in the module docstring; ``recs``: ``measure_task`` records in sample order). Shares are
    fractions in [0, 1], None when nothing was measured."""
    fid = [r["fidelity"] for r in recs]
    untraced = [(sample[k], f["untraced"]) for k, f in enumerate(fid) if "untraced" in f]
    torch_f = [f for f in fid if f.get("kind") == "torch"]
    tf_f = [f for f in fid if f.get("kind") == "transformers"]
    traced = len(torch_f) + len(tf_f)
    mismatches = [[sample[k], realism.op_labels(rows[sample[k]].get("ops")), f["traced"]]
                  for k, f in enumerate(fid) if f.get("kind") == "torch" and not f["exact_sequence"]]
    fidelity = {
        "n_sampled": len(fid), "n_traced": traced,
        "label_fidelity": _share(sum(f["exact_sequence"] for f in torch_f), len(torch_f)),
        "n_traced_on_cpu": sum(f.get("device") == "cpu" for f in fid),
        "torch": {"n": len(torch_f),
                  **{rule: _share(sum(f[rule] for f in torch_f), len(torch_f))
                     for rule in ("exact_sequence", "same_set", "all_listed_called", "all_listed_computed")}},
        "transformers": {"n": len(tf_f), "module_present": _share(sum(f["module_present"] for f in tf_f),
                                                                  len(tf_f))},
        "n_untraced": len(untraced),
        "untraced_reasons": [list(kv) for kv in Counter(reason_kind(r) for _, r in untraced).most_common(10)],
        "untraced_rows": [list(u) for u in untraced[:20]],
        "mismatch_examples": mismatches[:10],
    }
    kb = [r["kernelbench"] for r in recs]
    scored = [k for k in kb if "error" not in k]
    hits = [[sample[i], k["signature_matches"]] for i, k in enumerate(kb) if k.get("signature_hit")]
    kernelbench = {
        "n_sampled": len(kb), "n_scored": len(scored), "signature_hits": len(hits),
        "signature_hit_share": _share(len(hits), len(scored)),
        "signature_source": dict(Counter(k["signature_source"] for k in scored)),
        "verdicts": dict(Counter(k["verdict"] for k in scored).most_common()),
        "hit_examples": hits[:10],
        "errors": [list(kv) for kv in Counter(reason_kind(k["error"]) for k in kb if "error" in k).most_common(5)],
    }
    records = [r["realism"] for r in recs]
    dtypes = Counter(row_dtype(r) for r in records)
    figures = realism.summarise(records)
    return {"label_fidelity": fidelity, "kernelbench": kernelbench,
            "headroom": headroom_measures(sample, [r["headroom"] for r in recs]),
            "axis_misuse": axis_measures(sample, [r["axis"] for r in recs]),
            "dtype_share": {k: v / len(records) for k, v in sorted(dtypes.items())} if records else {},
            "realism": figures, "realism_targets": realism.check_targets(figures)}


def provenance() -> dict[str, Any]:
    """What produced a result: date (UTC), opforge version, machine (hostname, CPU count, platform) and the
    library versions (``engine.ledger.environment``)."""
    from importlib.metadata import PackageNotFoundError, version

    from opforge.engine.ledger import environment

    try:
        opforge_version = version("opforge")
    except PackageNotFoundError:
        opforge_version = None
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "opforge": opforge_version,
            "machine": {"hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
                        "platform": platform.platform()},
            "versions": environment("cpu")}


def _input_info(path: Path, n: int) -> dict[str, Any]:
    files = sorted((path / "data").glob("*.parquet")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return {"path": str(path), "rows": n, "sha256": digest.hexdigest(), "files": len(files)}


# ---------------------------------------------------------------------------------------------------------
# table


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _figure(key: str, v: Any) -> str:
    """A realism figure as the table shows it: shares in %, bytes in MB (10^6), other numbers plain."""
    if "_share" in key:
        return _pct(v)
    if key.startswith("input_bytes") and v is not None:
        return f"{v / 1e6:,.1f} MB"
    return _num(v)


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    """(measure, A, B) cells of the side-by-side table: counts plain, shares in %, bytes in MB (10^6)."""
    a, b = result["datasets"]["a"], result["datasets"]["b"]
    cross = result["cross_duplicates"]
    other = result["names"][1]

    def head(d, key):
        h = d["sample"]["headroom"]
        if key == "share":
            return _pct(h[f"share_below_{LOW_GAIN:g}"])
        return "-" if h["fusion_gain"] is None else f"{h['fusion_gain'][key]:.2f}"

    def axis(d):
        x = d["sample"]["axis_misuse"]
        return f"{_num(x['misused'])} ({_pct(x['share_of_traced'])} of {_num(x['n_traced'])} traced)"

    def both(fn) -> list[str]:
        return [fn(a), fn(b)]

    def fid(d, rule):
        f = d["sample"]["label_fidelity"]
        part = f["torch"] if rule != "module_present" else f["transformers"]
        n = part["n"]
        return f"{_pct(part[rule])} ({n})" if n else "-"

    kinds = sorted({k for d in (a, b) for k in d["labels"]["op_count_share"]})
    sources = sorted({k for d in (a, b) for k in d["labels"]["data_source_share"]})
    dtypes = sorted({k for d in (a, b) for k in d["sample"]["dtype_share"]})
    rows = [
        ["rows", *both(lambda d: _num(d["rows"]))],
        ["rows measured by tracing (sample)", *both(lambda d: _num(d["n_sampled"]))],
        ["distinct op labels (torch rows)", *both(lambda d: _num(d["labels"]["distinct_op_labels"]))],
        ["distinct op-label signatures (sorted label sets)",
         *both(lambda d: _num(d["labels"]["distinct_signatures"]))],
        ["largest number of rows sharing one signature",
         *both(lambda d: _num(d["labels"]["max_rows_per_signature"]))],
        ["distinct transformers modules", *both(lambda d: _num(d["labels"]["transformers_modules"]))],
        *[[f"share of torch rows with {k} op(s)",
           *both(lambda d, k=k: _pct(d["labels"]["op_count_share"].get(k, 0.0)))] for k in kinds],
        *[[f"share data_source {k}", *both(lambda d, k=k: _pct(d["labels"]["data_source_share"].get(k, 0.0)))]
          for k in sources],
        ["label fidelity: ops == traced call sequence (labels_match; traced torch rows)",
         *both(lambda d: fid(d, "exact_sequence"))],
        ["  same label set (order, multiplicity ignored)", *both(lambda d: fid(d, "same_set"))],
        ["  every listed label is a traced call", *both(lambda d: fid(d, "all_listed_called"))],
        ["  every listed op is computed (canonical names; DESIGN §6 rule)",
         *both(lambda d: fid(d, "all_listed_computed"))],
        ["  transformers rows: label names a module of the model (Ops-6K's Model is the renamed module)",
         *both(lambda d: fid(d, "module_present"))],
        ["  untraced rows (of sample)", *both(lambda d: _num(d["sample"]["label_fidelity"]["n_untraced"]))],
        ["exact duplicates within (normalised source)", *both(lambda d: _num(d["duplicates"]["exact"]))],
        ["near duplicates within (MinHash >= 0.9, same op signature)",
         *both(lambda d: _num(d["duplicates"]["near"]))],
        [f"rows exactly duplicating a row of {other}", _num(cross["exact"]), "-"],
        [f"rows nearly duplicating a row of {other}", _num(cross["near"]), "-"],
        ["KernelBench signature hits (sample)",
         *both(lambda d: f"{_num(d['sample']['kernelbench']['signature_hits'])} "
                         f"({_pct(d['sample']['kernelbench']['signature_hit_share'])})")],
        *[[f"fusion gain {q} (roofline, sample)", *both(lambda d, q=q: head(d, q))] for q in ("p10", "p50", "p90")],
        [f"share of rows with fusion gain < {LOW_GAIN:g} (sample)", *both(lambda d: head(d, "share"))],
        ["  rows the roofline could not trace (sample)",
         *both(lambda d: _num(d["sample"]["headroom"]["n_untraced"]))],
        ["axis misuse: axis-wise op over the batch axis or flat roll (sample)", *both(axis)],
        *[[f"dtype {k} (sample)", *both(lambda d, k=k: _pct(d["sample"]["dtype_share"].get(k, 0.0)))]
          for k in dtypes],
    ]
    for key in ("batch_p50", "batch_share_gt_8192", "largest_non_batch_p50", "heavy_op_share", "conv_share",
                "low_precision_share", "non_multiple_of_8_share", "distinct_non_batch_dims_500",
                "input_bytes_p50", "input_bytes_p95"):
        rows.append([f"realism: {key} (sample)",
                     *both(lambda d, key=key: _figure(key, d["sample"]["realism"].get(key)))])
    rows += diversity_rows([a["sample"]["realism"], b["sample"]["realism"]])
    return rows


def diversity_rows(figures: list[dict[str, Any]]) -> list[list[str]]:
    """The three diversity figures of multi-op rows (``task.realism``: exotic ops, op sets) as table rows, one
    cell per ``realism.summarise`` result in ``figures``: the top exotic op and its share, the top op set and
    its share, the number of distinct op sets and its share of the traced rows."""
    def top(f: dict[str, Any], name: str, share: str) -> str:
        return "-" if f.get(share) is None else f"{f.get(name) or 'none'} ({_pct(f[share])})"

    def distinct(f: dict[str, Any]) -> str:
        return "-" if f.get("distinct_op_set_share") is None else \
            f"{_num(f.get('distinct_op_sets'))} ({_pct(f['distinct_op_set_share'])})"

    return [["realism: top exotic op, share of rows (target <= 8 %; sample)",
             *[top(f, "top_exotic_op", "top_exotic_op_share") for f in figures]],
            ["realism: top op set (layout ops left out), share of rows (target <= 2 %; sample)",
             *[top(f, "top_op_set", "top_op_set_share") for f in figures]],
            ["realism: distinct op sets, share of rows (target >= 20 %; sample)", *[distinct(f) for f in figures]]]


def markdown_table(rows: list[list[str]], names: tuple[str, str] | list[str] = ("A", "B")) -> str:
    """The table as Markdown: a ``measure`` column, then one column per dataset titled by ``names``."""
    lines = [f"| measure | {names[0]} | {names[1]} |", "|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# main


def compare(a: str | Path, b: str | Path, kernelbench: str | None = None, workers: int = 2,
            limit: int | None = None, seed: int = 0, timeout_s: float = 120.0, memory_gib: float = 4.0,
            cpu_fallback_mb: float = 64.0, peaks: str = "h200", progress: bool = True) -> dict[str, Any]:
    """Compute every measure (module docstring) for datasets ``a`` and ``b`` and return the result.

    Args:
        a, b: dataset folders (``data/*.parquet``), Parquet or JSONL files.
        kernelbench: KernelBench reference (``.jsonl[.gz]`` / ``.parquet`` / ``hub:REPO@REV``; None: the
            contamination filter's default).
        workers: worker processes of the traced measures; limit: rows per dataset for them (a
            ``random.Random(seed)`` sample; None: every row); timeout_s: per-row limit in s; memory_gib:
            address-space margin per row in GiB; cpu_fallback_mb: label-fidelity CPU fallback limit in MB
            (10^6 bytes); peaks: ``task.peaks`` name of the roofline's datasheet peaks.

    Returns:
        ``{"benchmark", "measure_version", "names", "provenance", "settings", "seconds", "datasets": {"a",
        "b"}, "cross_duplicates", "table"}``; ``names`` are the column titles (``dataset_name``), ``table``
        the ``table_rows``.

    Raises:
        CompareInputError: a dataset cannot be read.
        ValueError: ``workers`` or ``limit`` below 1, or unknown ``peaks``.
        filters.kernelbench.ReferenceLoadError: the KernelBench reference cannot be loaded.
    """
    from opforge.filters.kernelbench import cached_index
    from opforge.task.peaks import get_peaks

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    peaks_info = get_peaks(peaks).describe()
    t0 = time.perf_counter()
    paths = {"a": Path(a), "b": Path(b)}
    data = {name: read_dataset(p) for name, p in paths.items()}
    samples = {name: sample_rows(len(rows), limit, seed) for name, rows in data.items()}
    index_path, index = cached_index(kernelbench, progress=progress)
    seconds: dict[str, float] = {"read_and_index": round(time.perf_counter() - t0, 1)}

    t1 = time.perf_counter()
    fps, recs = run_pool({n: (data[n], samples[n]) for n in data}, str(index_path), workers, timeout_s,
                         memory_gib, cpu_fallback_mb, progress, peaks)
    seconds["pool"] = round(time.perf_counter() - t1, 1)
    t2 = time.perf_counter()
    within = {name: duplicate_measures(rows, fps[name]) for name, rows in data.items()}
    cross = cross_duplicates(fps["a"], fps["b"], within["a"]["near_min"])
    seconds["duplicates"] = round(time.perf_counter() - t2, 1)
    t2 = time.perf_counter()
    datasets = {}
    for name, rows in data.items():
        sample = samples[name]
        datasets[name] = {"name": dataset_name(paths[name]), "input": _input_info(paths[name], len(rows)),
                          "rows": len(rows), "labels": label_measures(rows), "duplicates": within[name],
                          "n_sampled": len(sample), "sample_rows": sample if len(sample) <= 50 else
                          [*sample[:50], "..."],
                          "sample": sample_measures(rows, sample, recs[name])}
    seconds["summaries"] = round(time.perf_counter() - t2, 1)
    seconds["total"] = round(time.perf_counter() - t0, 1)
    names = [datasets["a"]["name"], datasets["b"]["name"]]
    if names[0] == names[1]:
        names = [f"A: {names[0]}", f"B: {names[1]}"]
    result = {
        "benchmark": "compare", "measure_version": MEASURE_VERSION, "names": names,
        "provenance": provenance(),
        "settings": {"workers": workers, "limit": limit, "seed": seed, "timeout_s": timeout_s,
                     "memory_gib": memory_gib, "cpu_fallback_mb": cpu_fallback_mb,
                     "trace_device": "meta (CPU with real tensors for rows that fail on meta and whose "
                                     f"inputs total <= {cpu_fallback_mb:g} MB)",
                     "peaks": peaks_info,
                     "kernelbench": index.identity(), "kernelbench_problems": len(index.problems)},
        "seconds": seconds, "datasets": datasets, "cross_duplicates": cross,
    }
    result["table"] = table_rows(result)
    return result


def write_compare(result: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """Write ``result`` (``compare``) as ``OUT/compare.json`` and its table as ``OUT/compare.md``; the folder
    is created. Returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "compare.json", out / "compare.md"
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    md_path.write_text(markdown_table(result["table"], result["names"]) + "\n")
    return json_path, md_path
