"""Recipe 3, own filter: a static filter (source only) that rejects a task calling none of the given ops, run
after the packaged static filter on composed candidates.

    python examples/extending/own_filter.py runs/own/candidates.parquet SquaredReLU scaled_tanh

To run it in every ``opforge run`` / ``opforge filter``, save the class in a module under ``filters/`` and add
its line to ``filters/chain.py: FILTERS`` (docs/filters.md, Adding a filter).
"""

import json
import sys

from opforge.filters.chain import FilterSettings, make_chain, run_chain
from opforge.filters.verdict import Cost, Filter, TaskInput


class CallsOwnOpFilter(Filter):
    """Rejects (``trivial:no_own_op``) a task whose ``ops`` (here: read from the source) call none of
    ``thresholds["ops"]``. Metrics: ``own_ops`` (how many of those names the source calls)."""

    name, cost, version = "calls_own_op", Cost.STATIC, 1

    @classmethod
    def default_thresholds(cls):
        return {"ops": ["SquaredReLU", "scaled_tanh"]}

    def score(self, task):
        return {"own_ops": sum(f"{op}(" in task.code for op in self.thresholds["ops"])}

    def decide(self, m):
        if m["own_ops"] == 0:
            return self.reject("trivial:no_own_op", m)
        return self.accept(m)


def main(path: str, ops: list[str]) -> dict:
    """Run the packaged static filter and ``CallsOwnOpFilter`` on each candidate of ``path``; return the
    count per reason (``accepted`` for kept ones)."""
    import pandas as pd

    chain = make_chain(FilterSettings(device="cpu", only=["static"]))
    own = CallsOwnOpFilter(**({"ops": ops} if ops else {}))
    counts: dict[str, int] = {}
    for code in pd.read_parquet(path, columns=["code"])["code"]:
        res = run_chain(TaskInput(code), [*chain, own])
        key = "accepted" if res["accepted"] else res["reason"]
        counts[key] = counts.get(key, 0) + 1
    return counts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), indent=1, sort_keys=True))
