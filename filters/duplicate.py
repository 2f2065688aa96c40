"""``duplicate``: keep one task per exact or near-identical source within a run.

A corpus filter: it scores all input rows at once, on the client, before any task is sent to a worker
(a duplicate costs no sandbox time). Rows are visited in input order and the first occurrence is kept.

* exact: equal normalised source (comments, docstrings and layout removed:
  ``task.identity.normalise_source``), so a copy with another comment is still exact;
* near: MinHash (datasketch, 128 permutations) Jaccard similarity of 5-token shingles of the structure
  tokens (``task.structure.module_tokens``: identifiers and op spellings normalised, constants kept) at or
  above ``near_min`` *and* the same op signature read from the source: a renamed copy with respelt ops is
  a duplicate, a copy with one more op is a different task. Candidates come from MinHash LSH at
  ``LSH_THRESHOLD``; each later row is compared with the rows kept so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opforge.filters.verdict import Cost, Filter, Verdict

LSH_THRESHOLD = 0.7  # candidate generation; near_min below this needs a re-score
NUM_PERM = 128
SHINGLE = 5


class DuplicateFilter(Filter):
    """Reject a row whose source repeats an earlier row's (``duplicate:exact``) or nearly does
    (``duplicate:near``). Metrics name the kept row (``duplicate_of``, an input row number) and, for near
    duplicates, the Jaccard estimate.

    Thresholds:
        near_min: Jaccard estimate at or above which two same-signature sources are near-duplicates (0.9:
            on Ops-6K it pairs renamed / respelt copies with different comments; see benchmarks/results/cpu-2core/contamination.json).
        near: whether near-duplicates are rejected at all (exact duplicates always are).
    """

    name, cost, order = "duplicate", Cost.STATIC, -10
    corpus = True  # scored over the whole input (``score_corpus``), not per task

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"near_min": 0.9, "near": True}

    def score_corpus(self, codes: Sequence[Any], progress: bool = False) -> list[dict[str, Any]]:
        """Metrics for every row of ``codes`` (input order): ``{}`` for a first occurrence,
        ``{"exact_of": row}`` or ``{"near_of": row, "jaccard": j}``. Non-string or unparsable code is
        compared as text only (exact)."""
        from datasketch import MinHash, MinHashLSH
        from opforge.task.identity import source_hash
        from opforge.task.structure import module_tokens, parse_task, shingles, static_op_signature
        from tqdm.auto import tqdm

        first: dict[str, int] = {}
        lsh = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
        kept: dict[int, tuple[Any, frozenset[str]]] = {}
        out: list[dict[str, Any]] = []
        for i, code in enumerate(tqdm(codes, desc="duplicate", unit="task", disable=not progress)):
            if not isinstance(code, str):
                out.append({})
                continue
            key = source_hash(code)
            if key in first:
                out.append({"exact_of": first[key]})
                continue
            first[key] = i
            tree = parse_task(code)
            if tree is None:
                out.append({})
                continue
            mh = MinHash(num_perm=NUM_PERM, seed=1)
            mh.update_batch(sorted(shingles(module_tokens(tree, constants=True), SHINGLE)))
            sig = static_op_signature(tree)
            best, best_j = None, 0.0
            for j in lsh.query(mh):
                other, other_sig = kept[j]
                jac = mh.jaccard(other)
                if other_sig == sig and (jac > best_j or (jac == best_j and best is not None and j < best)):
                    best, best_j = j, jac
            if best is not None:
                out.append({"near_of": best, "jaccard": round(best_j, 4)})
                if best_j >= self.thresholds["near_min"] and self.thresholds["near"]:
                    continue  # a duplicate never becomes the representative of others
            else:
                out.append({})
            lsh.insert(i, mh)
            kept[i] = (mh, sig)
        return out

    def decide(self, m: dict[str, Any]) -> Verdict:
        if "exact_of" in m:
            return self.reject("duplicate:exact", {"duplicate_of": m["exact_of"]})
        if "near_of" in m and self.thresholds["near"] and m["jaccard"] >= self.thresholds["near_min"]:
            return self.reject("duplicate:near", {"duplicate_of": m["near_of"], "jaccard": m["jaccard"]})
        return self.accept(m)

    def run_corpus(self, codes: Sequence[Any], progress: bool = False) -> list[Verdict]:
        """One verdict per row of ``codes`` (input order)."""
        return [self.decide(m) for m in self.score_corpus(codes, progress)]
