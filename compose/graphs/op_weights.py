"""Default op weights of the composer: how often real models run each op (its relevance), tempered.

The relevance of an op is its share in the op relevance table (``opforge.seeds.relevance``: the share of
real model configs whose forward calls it); the labels that spell one op (``torch.relu``, ``F.relu``,
``nn.ReLU``: ``seeds.public_api.alias_groups``) share it. The weight the sampler draws a label with is
``FLOOR + min(relevance, CAP) / spellings``:

* ``FLOOR`` keeps ops no traced model runs (scans, rare activations) in the dataset, at a low rate;
* ``CAP`` keeps the most common ops (layer norm, softmax, gelu, transpose, conv1d) from filling most tasks; the
  arithmetic operators and the GEMM / conv2d ops of ``UNCAPPED`` are exempt (they are the bulk of real models).

``--op-weights FILE`` (YAML or JSON, label -> weight) replaces the weight of each op it lists.
"""

from __future__ import annotations

from opforge.seeds.seed_op import SeedOp

FLOOR = 0.01
CAP = 0.08
UNCAPPED = frozenset({"+", "-", "*", "/", "torch.add", "torch.sub", "torch.mul", "torch.div", "torch.matmul",
                      "F.linear", "nn.Linear", "nn.Conv2d", "F.conv2d", "torch.conv2d"})


def default_op_weights(ops: list[SeedOp], table=None) -> dict[str, float]:
    """Label -> weight for every op of ``ops`` from the relevance ``table`` (default: the packaged one)."""
    from collections import Counter

    from opforge.seeds.public_api import alias_groups
    from opforge.seeds.relevance import default_relevance, label_relevance

    table = table if table is not None else default_relevance()
    labels = sorted({o.label for o in ops})
    rel = label_relevance(labels, table)
    group = alias_groups(labels)
    spellings = Counter(group.values())
    out = {}
    for lab in labels:
        n = spellings[group.get(lab, lab)] or 1
        total = rel.get(lab, 0.0) * n  # the op's share, before the even split over its spellings
        out[lab] = FLOOR + (total if lab in UNCAPPED else min(total, CAP)) / n
    return out


def merge_op_weights(defaults: dict[str, float], overrides: dict[str, float] | None) -> dict[str, float]:
    """``defaults`` with each label of ``overrides`` replaced. Raises ValueError for a negative weight."""
    out = dict(defaults)
    for label, w in (overrides or {}).items():
        if w < 0:
            raise ValueError(f"op weight of {label!r} is negative ({w})")
        out[label] = float(w)
    return out


def check_op_weights(catalog: list[SeedOp], overrides: dict[str, float] | None) -> None:
    """Raise ValueError naming each label of ``overrides`` that no op of ``catalog`` has, with the closest
    labels (a misspelled label would otherwise leave its op at the default weight)."""
    from opforge.seeds.user_ops import closest

    known = {o.label for o in catalog}
    unknown = [lab for lab in (overrides or {}) if lab not in known]
    if unknown:
        raise ValueError("op weights: " + "; ".join(f"unknown label {lab!r}{closest(lab, known)}" for lab in unknown)
                         + " (the catalog's labels: `opforge seeds list`)")
