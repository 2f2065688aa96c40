"""``contamination``: reject tasks that pose a KernelBench problem, however disguised.

Tiers (each tier's score is stored in the metrics, so thresholds can be re-decided):

0. ``exact``: the normalised source (comments, docstrings, layout removed) equals a problem's.
1. ``op_signature``: the *set* of canonical ops the ``Model`` calls equals a problem's (multiplicity and
   spelling ignored: ``torch.relu`` = ``F.relu`` = ``x.relu()`` = ``nn.ReLU``). A Linear→ReLU chain poses
   the same fusion problem as KernelBench's MLP whatever the sizes (docs/DESIGN.md §3). Traced on ``meta``;
   the source-read signature is the fallback when a task cannot run there.
2. ``structure``: similarity of the classes' structure tokens (``task.structure.class_tokens``:
   identifiers, constants, spellings normalised), Indel similarity 2·LCS/(|a|+|b|), the measure of
   difflib's ``ratio``; CUDA-Agent rejected AST similarity above 0.9 (arXiv 2602.24286).
3. ``minhash``: Jaccard similarity (MinHash estimate, datasketch) of 5-token shingles of the whole source.

Tiers 2 and 3 also require the task and the problem to compute mostly the same ops (``op_overlap`` =
Jaccard similarity of the two op signatures): two tiny programs differing only in their one op
(``torch.relu(x)`` vs ``torch.erf(x)``, overlap 0) are structurally 95 % alike but pose different
problems, and a KernelBench level-1 convolution with one epilogue op added (overlap 0.5) is a new
level-2-style fusion; a copy of a 3+-op problem with one op added (overlap >= 0.75) is not new.

Every verdict records ``kernelbench_nearest`` (``L<level>/<name>``) and ``kernelbench_similarity`` (the
tier-2 structural similarity to it): the problem matched by the strongest tier, else the structurally
closest problem.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from opforge.filters.kernelbench import (
    KernelBenchIndex,
    TaskFeatures,
    cached_index,
    load_index,
    task_features,
    traced_signature,
)
from opforge.filters.verdict import Cost, Filter, TaskInput, Verdict

TIERS = ("exact", "op_signature", "structure", "minhash")
TOP_K = 8  # candidates per similarity tier kept in the metrics (re-deciding looks only at these)
RECORD_MIN = 0.7  # similarity above which every problem sharing half its ops is also kept


def op_overlap(task_sig: frozenset[str], problem_sig: frozenset[str]) -> float:
    """Jaccard similarity of two op signatures, |a ∩ b| / |a ∪ b| (0..1; 0 when both are empty)."""
    union = task_sig | problem_sig
    return len(task_sig & problem_sig) / len(union) if union else 0.0


def _signatures(f: TaskFeatures, p: TaskFeatures) -> tuple[frozenset[str], frozenset[str]]:
    """Comparable signatures: traced on both sides when both traced, else both read from the source."""
    if f.signature_source == "trace" and p.signature_source == "trace":
        return f.signature, p.signature
    return f.static_signature, p.static_signature


def compare(index: KernelBenchIndex, f: TaskFeatures) -> dict[str, Any]:
    """Score one task's features against every problem of ``index`` (threshold-free).

    Returns: ``exact`` (problem name or None), ``signature_matches`` (names with an equal op set),
    ``structure_top`` / ``minhash_top`` (up to ``TOP_K`` of [name, similarity, op_overlap], best first),
    ``kernelbench_nearest`` and ``kernelbench_similarity``.
    """
    from rapidfuzz.distance import Indel
    from rapidfuzz.process import cdist

    n = len(index.problems)
    struct = cdist([f.structure], index.structures, scorer=Indel.normalized_similarity, dtype=np.float32)[0]
    jacc = (index.minhashes == f.minhash).mean(axis=1) if n else np.zeros(0)
    exact = index.by_exact.get(f.exact_key)
    overlaps = np.array([op_overlap(*_signatures(f, p)) for p in index.features])
    sig_matches = np.flatnonzero(overlaps == 1.0).tolist()  # Jaccard 1 = equal, non-empty op sets

    def top(scores: np.ndarray) -> list[list]:
        # the TOP_K most similar, plus every close candidate that shares most ops (so re-deciding at any
        # structure_min >= RECORD_MIN and overlap_min >= 0.5 sees every problem that could match)
        best = set(np.argsort(-scores, kind="stable")[:TOP_K].tolist())
        best |= set(np.flatnonzero((scores >= RECORD_MIN) & (overlaps >= 0.5)).tolist())
        order = sorted(best, key=lambda i: (-scores[i], i))[:4 * TOP_K]
        return [[index.problems[i], round(float(scores[i]), 4), round(float(overlaps[i]), 4)] for i in order]

    if exact is not None:
        nearest = exact
    elif sig_matches:
        nearest = max(sig_matches, key=lambda i: (struct[i], jacc[i]))
    else:
        nearest = int(np.argmax(struct)) if n else None
    return {
        "exact": index.problems[exact] if exact is not None else None,
        "signature_matches": [index.problems[i] for i in sig_matches][:TOP_K],
        "structure_top": top(struct), "minhash_top": top(jacc),
        "kernelbench_nearest": index.problems[nearest] if nearest is not None else None,
        "kernelbench_similarity": round(float(struct[nearest]), 4) if nearest is not None else None,
    }


class ContaminationFilter(Filter):
    """Reject tasks matching a KernelBench problem by any enabled tier (see the module docstring).

    Thresholds (defaults chosen on the disguise suite and Ops-6K: ``benchmarks/results/cpu-2core/contamination.json``, ``benchmarks/README.md``):
        structure_min: tier-2 similarity at or above which a task is a copy (0.9, CUDA-Agent's value).
        minhash_min: tier-3 Jaccard estimate at or above which a task is a copy.
        overlap_min: op-signature Jaccard similarity a tier-2/3 match must reach.
        tiers: the tiers that may reject.

    Args:
        index: a ``KernelBenchIndex``, the path of a saved one (``filters.kernelbench.save_index``), or None
            for the default reference's cached index (``filters.kernelbench.cached_index``), built on first
            use.
    """

    name, cost = "contamination", Cost.CPU

    def __init__(self, index: KernelBenchIndex | str | None = None, **thresholds):
        super().__init__(**thresholds)
        unknown = set(self.thresholds["tiers"]) - set(TIERS)
        if unknown:
            raise ValueError(f"contamination: unknown tier(s) {sorted(unknown)}; known: {', '.join(TIERS)}")
        self._index = index

    @property
    def index(self) -> KernelBenchIndex:
        if self._index is None:
            self._index = cached_index()[1]
        if not isinstance(self._index, KernelBenchIndex):
            self._index = load_index(self._index)
        return self._index

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"structure_min": 0.9, "minhash_min": 0.8, "overlap_min": 0.75, "tiers": list(TIERS)}

    def score(self, task: TaskInput) -> dict[str, Any]:
        traced, err = traced_signature(task.code, task.task_id)
        f = task_features(task.code, traced)
        return {"signature": sorted(f.signature), "signature_source": f.signature_source,
                "trace_error": err, **compare(self.index, f)}

    def decide(self, m: dict[str, Any]) -> Verdict:
        t = self.thresholds
        tiers = set(t["tiers"])
        if "exact" in tiers and m["exact"]:
            return self.reject("contaminated:exact", m)
        if "op_signature" in tiers and m["signature_matches"]:
            return self.reject("contaminated:op_signature", m)
        for tier, key, lo in (("structure", "structure_top", t["structure_min"]),
                              ("minhash", "minhash_top", t["minhash_min"])):
            if tier in tiers and any(s >= lo and o >= t["overlap_min"] for _, s, o in m[key]):
                return self.reject(f"contaminated:{tier}", m)
        return self.accept(m)
