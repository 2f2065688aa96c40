"""The data card of a small run states only what its own rows hold (issue #62): every range, bound, share and top
list of the rendered card is checked against the published rows, the op-count plot's labels do not overlap, and
``opforge status`` reports the funnel the card reports, on a run with duplicates and rejections."""

import json
import re
from collections import Counter
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from opforge.data_cards.plots import op_count_figure
from opforge.pipeline import select
from opforge.pipeline.funnel_counts import funnel_counts
from opforge.pipeline.hub_folder import COLUMNS, build_hub_folder
from opforge.pipeline.run import _card_context, _funnel_summary
from opforge.pipeline.run_config import RunConfig
from opforge.pipeline.status import format_status, run_status

ENV = {"gpu": None, "torch": "2.13.0+cpu", "transformers": "5.0", "triton": None, "python": "3.11"}
MODELS = ["transformers:llama", "transformers:gpt2", "torchvision:resnet50"]


def _row(i: int) -> dict:
    """Published row ``i``: op counts 2-9, batches up to 4096, motif rows without a size context."""
    k = 2 + i % 8
    ops = ["Tensor.reshape", "nn.LayerNorm", *[f"torch.op{(i + j) % 11}" for j in range(k - 2)]]
    if i % 5 == 0:
        ops.append("torch.cumsum")
    batch = [4, 16, 768, 4096, 32][i % 5]
    motif = i % 3 != 0
    prov = json.dumps({"motif_id": f"m{i}", "source": MODELS[i % 3], "category": "norm"}) if motif else ""
    return {"task_id": f"{i:016x}", "ops": json.dumps(ops), "data_source": f"torch#{len(ops)}",
            "code": f"# task {i}", "num_ops": len(ops), "graph": "{}", "categories": json.dumps(["norm"]),
            "input_shapes": json.dumps([[batch, 64 + i], [batch, 8]]),
            "dtype": ["float32", "bfloat16", "float16"][i % 3],
            "size_context": "" if motif else ["bert", "vit"][i % 2], "provenance": prov,
            "eager_ms": 0.1 + i / 100, "compile_ms": None, "roofline_ms": 0.01, "fusion_gain": 1.5 + i % 3,
            "gpu": "cpu", "torch_version": ENV["torch"], "kernelbench_nearest": "L1/x",
            "kernelbench_similarity": 0.2, "generator": "opforge-compose/1.3", "generator_seed": 3,
            "opforge_version": "0.1.0", "shape_variants": "[]"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A run directory as ``opforge run`` leaves it: 60 candidates (4 duplicates, 8 rejected), 40 selected."""
    root = tmp_path_factory.mktemp("card") / "run"
    pool = pd.DataFrame([_row(i) for i in range(48)])
    cands = pd.concat([pool, pool.iloc[:4], pd.DataFrame([_row(100 + i) for i in range(8)])], ignore_index=True)
    reasons = [None] * 48 + ["duplicate:exact"] * 4 + ["trivial:noop"] * 5 + ["eager_error"] * 3
    verdicts = pd.DataFrame({"task_id": cands["task_id"], "accepted": [r is None for r in reasons],
                             "reason": reasons, "filter": [None if r is None else r.split(":")[0] for r in reasons]})
    cfg = RunConfig(target=40, out=root, seed=3).resolved()
    sel = select.select_tasks(pool, 40, select.bucket_shares({}, 0.0, pool, keep_pool_mix=True), seed=3,
                              max_per_signature=cfg.max_per_signature, max_op_share=cfg.max_op_share,
                              max_op_set_share=cfg.max_op_set_share)
    rows = sel.rows
    res = SimpleNamespace(verdicts=verdicts, funnel={"by_reason_detail": dict(Counter(r for r in reasons if r))})
    settings = SimpleNamespace(names=lambda: ["duplicate", "trivial", "eager"], runtime_window_ms=None)
    funnel = _funnel_summary(cands, res, 1, "target of 40 reached after 60 candidates", settings)
    funnel["counts"] = funnel_counts(cands["task_id"], verdicts, len(rows))
    context = _card_context(cfg, rows, funnel, sel, ENV)
    context["variants"] = {"tasks": 0}
    (root / "candidates").mkdir(parents=True)
    (root / "filter").mkdir()
    cands.to_parquet(root / "candidates" / "round-0000.parquet")
    verdicts.to_parquet(root / "filter" / "verdicts.parquet")
    (root / "config.yaml").write_text(yaml.safe_dump({"target": 40, "device": "cpu", "seed": 3}))
    (root / "selection.json").write_text(json.dumps({"task_ids": list(rows["task_id"])}))
    (root / "run.json").write_text(json.dumps({"selected": len(rows), "accepted": funnel["accepted"], "rounds": 1,
                                               "candidates": len(cands), "stop_reason": funnel["stop_reason"],
                                               "funnel": funnel["counts"]}))
    build_hub_folder(rows[[c for c, *_ in COLUMNS]], root / "hf", context, {"funnel": funnel})
    return root, rows, (root / "hf" / "README.md").read_text()


def test_card_statements_are_those_of_its_rows(small_run):
    _, rows, card = small_run
    # data_source: the k range of the torch#k rows
    ks = sorted(int(s.split("#")[1]) for s in rows["data_source"])
    assert ks[0] == 2 and ks[-1] > 5  # the rows span op counts past 5
    assert f"`torch#k` (k composed ops; k = {ks[0]}-{ks[-1]} in these rows)" in card
    assert "1-5)" not in card
    # the batch: first dim of the first input, its range as the rows hold it
    batches = [json.loads(s)[0][0] for s in rows["input_shapes"]]
    assert max(batches) > 512
    assert f"First-input batch (first dim of the first input): {min(batches)} to {max(batches)}," in card
    assert "at most 512" not in card
    # selection notes: the exotic op and the op set named are the rows' own most frequent, at their share
    exotic = Counter(o for s in select.exotic_ops(rows) for o in s)
    top, n = max(exotic.items(), key=lambda kv: (kv[1], kv[0]))
    assert f"most frequent exotic op: {top} in {n / len(rows):.1%} of those chosen" in card
    sets = Counter(select.op_sets(rows))
    m = re.search(r"most frequent op set: (.+?) in ([\d.]+)% of those chosen", card)
    assert m and float(m.group(2)) == pytest.approx(100 * max(sets.values()) / len(rows), abs=0.05)
    assert Counter(" + ".join(sorted(s)) for s in select.op_sets(rows))[m.group(1)] == max(sets.values())
    # the most used seed ops table: each count is the number of rows listing the label
    labels = Counter(x for s in rows["ops"] for x in json.loads(s))
    for op, count in re.findall(r"^\| `([^`]+)` \| (\d+) \|$", card.split("Most used seed ops:")[1]
                                .split("## ")[0], flags=re.M):
        assert labels[op] == int(count), op
    # dtype shares
    for dtype, share in rows["dtype"].value_counts(normalize=True).items():
        assert f"| `{dtype}` | {100 * share:.1f} % |" in card
    # size contexts: a row's size_context, else its motif's source model; the rest have fixed sizes
    ctx = Counter(c or (json.loads(p)["source"] if p else "") for c, p in zip(rows["size_context"],
                                                                          rows["provenance"], strict=True))
    line = card.split("Most common size contexts")[1].split("\n\n")[0]
    for fam, count in re.findall(r"`([^`]+)` \((\d+)\)", line):
        assert ctx[fam] == int(count), fam
    assert sum(int(c) for _, c in re.findall(r"`([^`]+)` \((\d+)\)", line)) == sum(v for k, v in ctx.items() if k)
    # motif sources: the libraries named are those of the rows
    libs = sorted({json.loads(p)["source"].split(":")[0] for p in rows["provenance"] if p})
    assert f"forward pass of real models ({', '.join(libs)})" in card


def test_status_and_the_card_report_the_same_funnel(small_run):
    root, rows, card = small_run
    status = format_status(run_status(root))
    line = next(x for x in status.splitlines() if x.startswith("funnel: "))
    nums = dict((k, int(v.replace(",", ""))) for v, k in re.findall(r"([\d,]+) (candidates|unique|verdicted|"
                                                                   r"duplicates|accepted|selected)", line))
    assert nums == {"candidates": 60, "unique": 56, "verdicted": 60, "duplicates": 4, "accepted": 48,
                    "selected": len(rows)}
    assert (f"{nums['candidates']} candidates ({nums['unique']} distinct task ids)" in card
            and f"{nums['verdicted']} verdicted, {nums['duplicates']} of them rejected as duplicates" in card
            and f"{nums['accepted']} accepted by every filter" in card and f"{nums['selected']} selected." in card)
    assert json.loads((root / "run.json").read_text())["funnel"]["accepted"] == nums["accepted"]
    assert f"| accepted | {nums['accepted']} |" in card


def test_op_count_plot_labels_do_not_overlap():
    """One bar per data_source value, in op-count order, and no two tick labels overlap, for 2 to 30 values."""
    for n in (2, 12, 30):
        rows = pd.DataFrame({"data_source": [f"torch#{k}" for k in range(1, n)] + ["transformers"]})
        fig = op_count_figure(rows)
        fig.canvas.draw()
        ax = fig.axes[0]
        labels = [t for t in ax.get_yticklabels() if t.get_text()]
        assert [t.get_text() for t in labels][::-1] == [*(f"torch#{k}" for k in range(1, n)), "transformers"]
        boxes = [t.get_window_extent() for t in labels]
        assert all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
