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
from dataclasses import dataclass
from typing import Any

from opforge.filters.verdict import Cost, Filter, Verdict

LSH_THRESHOLD = 0.7  # candidate generation; near_min below this needs a re-score
NUM_PERM = 128
SHINGLE = 5


@dataclass
class Fingerprint:
    """What the duplicate rule compares for one source.

    Attributes:
        exact_key: ``task.identity.source_hash`` of the source (equal for exact duplicates).
        minhash: MinHash (``NUM_PERM`` permutations, seed 1) of the ``SHINGLE``-token shingles of the
            structure tokens with constants kept; None when the source does not parse.
        signature: the op signature read from the source (``task.structure.static_op_signature``); None when
            the source does not parse.
    """

    exact_key: str
    minhash: Any = None
    signature: frozenset[str] | None = None


def fingerprint(code: str) -> Fingerprint:
    """The ``Fingerprint`` of one task source (a string; unparsable sources get only ``exact_key``)."""
    from datasketch import MinHash
    from opforge.task.identity import source_hash
    from opforge.task.structure import module_tokens, parse_task, shingles, static_op_signature

    key = source_hash(code)
    tree = parse_task(code)
    if tree is None:
        return Fingerprint(key)
    mh = MinHash(num_perm=NUM_PERM, seed=1)
    mh.update_batch(sorted(shingles(module_tokens(tree, constants=True), SHINGLE)))
    return Fingerprint(key, mh, static_op_signature(tree))


class NearIndex:
    """MinHash LSH (``LSH_THRESHOLD``) over fingerprints, answering "which indexed source is the nearest
    same-signature neighbour of this one"."""

    def __init__(self):
        from datasketch import MinHashLSH

        self._lsh = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
        self._kept: dict[Any, Fingerprint] = {}

    def insert(self, key: Any, fp: Fingerprint) -> None:
        """Index ``fp`` under ``key`` (a hashable, unique per insert); a fingerprint without MinHash is
        ignored."""
        if fp.minhash is None:
            return
        self._lsh.insert(key, fp.minhash)
        self._kept[key] = fp

    def nearest(self, fp: Fingerprint) -> tuple[Any, float]:
        """(key, Jaccard estimate) of the LSH candidate with the same op signature and the highest Jaccard
        estimate (ties: the smallest key), or (None, 0.0) when there is none."""
        best, best_j = None, 0.0
        if fp.minhash is None:
            return best, best_j
        for j in self._lsh.query(fp.minhash):
            other = self._kept[j]
            jac = fp.minhash.jaccard(other.minhash)
            if other.signature == fp.signature and (jac > best_j or (jac == best_j and best is not None
                                                                     and j < best)):
                best, best_j = j, jac
        return best, best_j


class DuplicateFilter(Filter):
    """Reject a row whose source repeats an earlier row's (``duplicate:exact``) or nearly does
    (``duplicate:near``). Metrics name the kept row (``duplicate_of``, an input row number) and, for near
    duplicates, the Jaccard estimate.

    Thresholds:
        near_min: Jaccard estimate at or above which two same-signature sources are near-duplicates (0.9:
            on Ops-6K it pairs renamed / respelt copies with different comments; see benchmarks/results/cpu-2core/contamination.json).
        near: whether near-duplicates are rejected at all (exact duplicates always are).
    """

    name, cost = "duplicate", Cost.STATIC
    corpus = True  # scored over the whole input (``score_corpus``), not per task

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"near_min": 0.9, "near": True}

    def score_corpus(self, codes: Sequence[Any], progress: bool = False,
                     fingerprints: Sequence[Fingerprint | None] | None = None) -> list[dict[str, Any]]:
        """Metrics for every row of ``codes`` (input order): ``{}`` for a first occurrence,
        ``{"exact_of": row}`` or ``{"near_of": row, "jaccard": j}``. Non-string or unparsable code is
        compared as text only (exact). ``fingerprints``: ``fingerprint(code)`` of every string row, computed
        beforehand (e.g. in parallel); computed here when None.

        Raises:
            ValueError: ``fingerprints`` is not as long as ``codes``.
        """
        return self.scanner().scan(codes, progress, fingerprints)

    def scanner(self) -> DuplicateScan:
        """A ``DuplicateScan`` with this filter's thresholds: ``score_corpus`` fed in pieces."""
        return DuplicateScan(self.thresholds)

    def decide(self, m: dict[str, Any]) -> Verdict:
        if "exact_of" in m:
            return self.reject("duplicate:exact", {"duplicate_of": m["exact_of"]})
        if "near_of" in m and self.thresholds["near"] and m["jaccard"] >= self.thresholds["near_min"]:
            return self.reject("duplicate:near", {"duplicate_of": m["near_of"], "jaccard": m["jaccard"]})
        return self.accept(m)

    def run_corpus(self, codes: Sequence[Any], progress: bool = False,
                   fingerprints: Sequence[Fingerprint | None] | None = None) -> list[Verdict]:
        """One verdict per row of ``codes`` (input order); ``fingerprints`` as in ``score_corpus``."""
        return [self.decide(m) for m in self.score_corpus(codes, progress, fingerprints)]


class DuplicateScan:
    """``DuplicateFilter.score_corpus`` over rows that arrive in pieces: each ``scan`` call continues the row
    numbering and compares its rows with every row scanned before, so scanning a list in pieces gives the
    metrics of scanning it at once (a row's metrics depend only on the rows before it)."""

    def __init__(self, thresholds: dict[str, Any]):
        self.thresholds = thresholds
        self.rows = 0
        self.first: dict[str, int] = {}
        self.index = NearIndex()

    def scan(self, codes: Sequence[Any], progress: bool = False,
             fingerprints: Sequence[Fingerprint | None] | None = None) -> list[dict[str, Any]]:
        """Metrics of the next rows ``codes``, row numbers counted from the first row ever scanned (see
        ``DuplicateFilter.score_corpus``). Raises ValueError: ``fingerprints`` is not as long as ``codes``."""
        if fingerprints is not None and len(fingerprints) != len(codes):
            raise ValueError(f"duplicate: {len(fingerprints)} fingerprints for {len(codes)} rows")
        from tqdm.auto import tqdm

        out: list[dict[str, Any]] = []
        for k, code in enumerate(tqdm(codes, desc="duplicate", unit="task", disable=not progress)):
            i = self.rows
            self.rows += 1
            if not isinstance(code, str):
                out.append({})
                continue
            fp = fingerprint(code) if fingerprints is None else fingerprints[k]
            if fp.exact_key in self.first:
                out.append({"exact_of": self.first[fp.exact_key]})
                continue
            self.first[fp.exact_key] = i
            if fp.minhash is None:
                out.append({})
                continue
            best, best_j = self.index.nearest(fp)
            if best is not None:
                out.append({"near_of": best, "jaccard": round(best_j, 4)})
                if best_j >= self.thresholds["near_min"] and self.thresholds["near"]:
                    continue  # a duplicate never becomes the representative of others
            else:
                out.append({})
            self.index.insert(i, fp)
        return out
