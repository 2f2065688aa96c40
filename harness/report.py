"""Aggregate evaluation results into the metrics of CUDA-Agent's Table 1 (arXiv 2602.24286), overall and
per ``data_source``.

Definitions (over the tasks evaluated, ``n``):

* ``pass_rate``: share of tasks whose solution is correct (status ``correct``);
* ``faster_than_eager_rate`` / ``faster_than_compile_rate``: share of tasks whose solution is correct and
  faster than eager / ``torch.compile`` (speed-up > 1; a task without a compile timing is not counted
  as faster than compile);
* ``geomean_speedup_eager`` / ``geomean_speedup_compile``: geometric mean of the speed-ups over the
  correct solutions (those with a timing);
* plus ``mean_reward``, ``hacked_rate`` and counts per status, and seconds spent building vs verifying /
  profiling.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def metrics(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of a list of ``EvalResult`` dicts (see the module docstring); empty input gives n = 0."""
    n = len(results)
    correct = [r for r in results if r["status"] == "correct"]
    out: dict[str, Any] = {"n": n, "status": dict(Counter(r["status"] for r in results).most_common())}
    if not n:
        return out
    out.update({
        "pass_rate": len(correct) / n,
        "faster_than_eager_rate": sum(1 for r in correct if (r.get("speedup_eager") or 0) > 1) / n,
        "faster_than_compile_rate": sum(1 for r in correct if (r.get("speedup_compile") or 0) > 1) / n,
        "geomean_speedup_eager": _geomean([r.get("speedup_eager") for r in correct]),
        "geomean_speedup_compile": _geomean([r.get("speedup_compile") for r in correct]),
        "mean_reward": sum(r["reward"] for r in results) / n,
        "hacked_rate": sum(1 for r in results if r["status"] == "hacked") / n,
        "build_s_total": sum(r.get("build_s") or 0.0 for r in results),
        "verify_s_total": sum(r.get("verify_s") or 0.0 for r in results),
        "profile_s_total": sum(r.get("profile_s") or 0.0 for r in results),
        "eval_s_total": sum(r.get("eval_s") or 0.0 for r in results),
    })
    return out


def report(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"overall": metrics, "by_data_source": {source: metrics}}``."""
    by: dict[str, list] = {}
    for r in results:
        by.setdefault(str(r.get("data_source")), []).append(r)
    return {"overall": metrics(results), "by_data_source": {k: metrics(v) for k, v in sorted(by.items())}}
