"""``opforge release`` (``pipeline.release``): a release folder assembled from a small run directory built by
hand the way ``opforge run`` lays it out (CPU, no sandbox, seconds)."""

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from datasets import load_dataset
from opforge.data_cards.render import front_matter
from opforge.pipeline.cli import app
from opforge.pipeline.hub_folder import COLUMNS, features, manifest, write_shards
from opforge.pipeline.release import ReleaseError, assemble_release, whole_run_funnel
from opforge.task.identity import source_hash, task_id_for
from opforge.task.realism import check_targets
from typer.testing import CliRunner

FP = "f00dfeedf00dfeed"
ENV = {"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}


def _kb_task(forward: str, shape: str, init: str = "") -> str:
    """A KernelBench-format source: ``Model.forward(x)`` returning ``forward`` on ``torch.randn(shape)``."""
    return (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n        {init or 'pass'}\n\n    def forward(self, x):\n"
            f"        return {forward}\n\n\nbatch_size = 16\n\n\ndef get_inputs():\n"
            f"    return [torch.randn(batch_size, {shape})]\n\n\ndef get_init_inputs():\n    return []\n")


SOURCES = [
    _kb_task("torch.sigmoid(torch.tanh(x))", "32"),
    _kb_task("torch.relu(self.fc(x))", "32", "self.fc = nn.Linear(32, 32)"),
    _kb_task("torch.nn.functional.gelu(x) * 2.0", "64"),
    _kb_task("x + 1.0", "8"),  # rejected: trivial
    _kb_task("torch.sigmoid(torch.tanh(x))", "32").replace("    pass", "    pass  # same task"),  # duplicate
    _kb_task("torch.exp(x)", "128"),  # not filtered (its signature was full)
]
# per candidate: (verdict row?, accepted, reason, filter, worker)
VERDICTS = [
    (True, True, None, None, "0"),
    (True, True, None, None, "1"),
    (True, True, None, None, "0"),
    (True, False, "trivial:noop", "trivial", "1"),
    (True, False, "duplicate:exact", "duplicate", "client"),
    (False, None, None, None, None),
]
SELECTED = [0, 1, 2]


def _published_row(code: str) -> dict:
    row = {name: "" for name, *_ in COLUMNS}
    row.update({"ops": '["torch.tanh"]', "data_source": "torch#2", "code": code, "task_id": task_id_for(code),
                "num_ops": 2, "graph": "{}", "categories": '["activation"]', "input_shapes": "[[16, 32]]",
                "dtype": "float32", "eager_ms": 0.5, "compile_ms": None, "roofline_ms": 0.01, "fusion_gain": 2.0,
                "gpu": "cpu", "torch_version": "2.13.0", "kernelbench_nearest": "L1/19_ReLU",
                "kernelbench_similarity": 0.3, "generator": "opforge-compose/0.5", "generator_seed": 0,
                "opforge_version": "0.1.0",
                "shape_variants": json.dumps([{"sizes": {"batch_size": 8}, "input_shapes": [[8, 32]],
                                               "work_ratio": 0.5}])})
    return row


CARD_BODY = """
# tiny

3 tasks. Every number on this card was measured by the run that built the dataset (run seed 0).

## How to load

`load_dataset("path/to/this/folder", split="train")`

## Filter funnel

the run's own funnel (last pass only)

## Environment

| | |
|---|---|
| device | CPU |

## Limitations

- Runtimes refer to the device above.
- Realism target `top_other_op_share` is not met: 35.0 % (reshape) against <= 8 % (see Realism).

## Licence

Licence: apache-2.0.
"""


def make_run(root: Path) -> Path:
    """A finished run directory (one round of 6 candidates: 3 accepted and selected, 1 rejected, 1 corpus
    duplicate, 1 not filtered) with its Hub folder ``hf/``."""
    run = root / "run"
    (run / "candidates").mkdir(parents=True)
    ids = [task_id_for(c) for c in SOURCES]
    pd.DataFrame({"task_id": ids, "code": SOURCES}).to_parquet(run / "candidates" / "round-0000.parquet")
    (run / "filter").mkdir()
    vrows, ledger = [], []
    for i, (tid, (has, acc, reason, filt, worker)) in enumerate(zip(ids, VERDICTS, strict=True)):
        if not has:
            continue
        vrows.append({"row": i, "task_id": tid, "accepted": acc, "reason": reason, "filter": filt,
                      "metrics": "{}", "worker": worker})
        if worker != "client":
            ledger.append({"task_id": tid, "accepted": acc, "reason": reason, "filter": filt, "fingerprint": FP,
                           "seconds": {"eager": 0.5, "compile": 2.0}, "worker": worker})
    pd.DataFrame(vrows).to_parquet(run / "filter" / "verdicts.parquet", index=False)
    stale = {**ledger[0], "fingerprint": "0ld0ld0ld0ld0ld0", "accepted": False, "reason": "timeout"}
    lines = [json.dumps(stale)] + [json.dumps(r) for r in ledger] + ['{"task_id": "cut']
    (run / "filter" / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    (run / "filter" / "funnel.json").write_text(json.dumps({
        "fingerprint": FP, "environment": {"device": "cpu", "torch": "2.13.0", "python": "3.11"},
        "ran_this_time": 1, "resumed_from_ledger": 3, "wall_s": 2.0, "tasks_per_min": 30.0}))
    accepted = sum(1 for v in VERDICTS if v[1])
    (run / "run.json").write_text(json.dumps({
        "selected": len(SELECTED), "accepted": accepted, "candidates": len(SOURCES), "rounds": 1,
        "stop_reason": "target of 3 reached after 6 candidates", "seconds": {"filter": 2.0},
        "not_filtered_full_signature": sum(1 for v in VERDICTS if not v[0]),
        "timeline": {"stages": {"filter": {"wall_s": 2.0}}}}))
    (run / "selection.json").write_text(json.dumps({"task_ids": [ids[i] for i in SELECTED]}))
    (run / "config.yaml").write_text(yaml.safe_dump({"target": 3, "seed": 0, "device": "cpu"}))
    hf = run / "hf"
    rows = pd.DataFrame([_published_row(SOURCES[i]) for i in SELECTED])
    _, nbytes = write_shards(rows, hf / "data")
    fm = front_matter(pretty_name="tiny", license="apache-2.0", features=features(), n_rows=len(rows),
                      num_bytes=nbytes, data_glob="data/train-*.parquet", tags=["opforge"])
    (hf / "README.md").write_text(f"---\n{fm}\n---\n{CARD_BODY}", encoding="utf-8")
    (hf / "plots").mkdir()
    (hf / "plots" / "op_count.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a picture")
    (hf / "opforge_run.json").write_text(json.dumps({"config": {"target": 3, "seed": 0, "device": "cpu",
                                                                "out": "."},
                                                     "selection": {"task_ids": [ids[i] for i in SELECTED]}}))
    return run


def _data_sha(hf: Path) -> str:
    digest = hashlib.sha256()
    for p in sorted((hf / "data").glob("*.parquet")):
        digest.update(p.read_bytes())
    return digest.hexdigest()


def make_steps(run: Path, root: Path) -> dict[str, Path]:
    """The reports of the steps after the run, in the shapes `opforge recheck` and `opforge compare` write."""
    ids = json.loads((run / "selection.json").read_text())["task_ids"]
    recheck = root / "recheck.json"
    recheck.write_text(json.dumps({
        "rows": 2, "verdicted": 2, "all_rules_pass": 1, "all_rules_pass_rate": 0.5,
        "rules": {"eager": {"checked": True, "pass": 2, "fail": 0, "not_reached": 0, "pass_rate": 1.0},
                  "runtime_window": {"checked": True, "pass": 1, "fail": 1, "not_reached": 0, "pass_rate": 0.5},
                  "compile_agreement": {"checked": False}},
        "failures": [{"task_id": ids[1], "rule": "runtime_window", "reason": "runtime_out_of_window:too_fast"}],
        "eager_ratio": {"n": 2, "p10": 0.9, "p50": 1.0, "p90": 1.1},
        "device": {"recheck": "cpu", "published": {"cpu": 2}, "same": True},
        "source": str((run / "recheck_sample.parquet").resolve())}))  # an absolute path: made portable
    figures = {"rows": 3, "batch_p50": 16.0, "heavy_op_share": 0.33, "top_exotic_op_share": 0.5,
               "top_exotic_op": "cumsum", "top_op_set_share": 0.01, "top_op_set": "add + layer_norm",
               "distinct_op_sets": 3, "distinct_op_set_share": 1.0}
    compare = root / "compare.json"
    compare.write_text(json.dumps({
        "benchmark": "compare", "measure_version": 2, "names": ["run", "reference"],
        "settings": {"limit": None, "seed": 0, "peaks": {"name": "h200"}},
        "datasets": {"a": {"rows": 3, "input": {"sha256": _data_sha(run / "hf")},
                           "sample": {"realism": figures, "realism_targets": check_targets(figures)}},
                     "b": {"rows": 2}},
        "cross_duplicates": {"exact": 0, "near": 0, "near_min": 0.9},
        "table": [["rows", "3", "2"], ["exact duplicates within (normalised source)", "0", "0"],
                  ["share of rows with 9 ops", "0.0 %", "0.0 %"]],
        "provenance": {"opforge": "0.1.0"}, "seconds": {"total": 1.0}}))
    changelog = root / "CHANGELOG.md"
    changelog.write_text("# 1.1\n\n- three tasks\n")
    return {"recheck": recheck, "compare": compare, "changelog": changelog}


@pytest.fixture()
def run(tmp_path):
    return make_run(tmp_path)


def test_whole_run_funnel_counts_every_candidate(run):
    f = whole_run_funnel(run)
    filtered = [v for v in VERDICTS if v[0]]
    assert f["candidates"] == len(SOURCES) and f["rounds"] == 1
    assert f["not_filtered"] == len(SOURCES) - len(filtered)
    assert f["corpus_verdicts"] == sum(1 for v in filtered if v[4] == "client")
    assert f["ledger_verdicts"] + f["corpus_verdicts"] == f["filtered"] == len(filtered)
    assert f["accepted"] == sum(1 for v in filtered if v[1])
    assert f["by_reason"] == {"trivial": 1, "duplicate": 1}
    assert f["ledger_other_fingerprint"] == 1 and f["ledger_cut_lines"] == 1  # neither counts as a verdict
    assert f["by_filter"]["eager"] == {"ran": f["ledger_verdicts"], "rejected": 0,
                                       "sandbox_s": 0.5 * f["ledger_verdicts"]}
    assert f["by_filter"]["duplicate"]["rejected"] == 1


def test_whole_run_funnel_counts_only_the_rounds_the_run_reached(run):
    """Rounds composed ahead (``opforge run --compose-rounds``) past the round where the target was met, and a
    temporary round file, are not the run's candidates; run.json counts a task skipped twice in a round once."""
    before = whole_run_funnel(run)
    first = pd.read_parquet(run / "candidates" / "round-0000.parquet")
    ahead = first.assign(task_id=[f"{t[:-1]}x" for t in first["task_id"]])
    ahead.to_parquet(run / "candidates" / "round-0001.parquet")
    ahead.to_parquet(run / "candidates" / "round-0002.tmp.parquet")
    f = whole_run_funnel(run)
    assert f["candidates"] == before["candidates"] and f["rounds"] == 1 and f["rounds_not_reached"] == 1
    # the skipped candidate composed twice: two rows, one task
    skipped = first[~first["task_id"].isin(pd.read_parquet(run / "filter" / "verdicts.parquet")["task_id"])]
    assert len(skipped) == 1
    twice = pd.concat([first, skipped], ignore_index=True)
    twice.to_parquet(run / "candidates" / "round-0000.parquet")
    rec = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**rec, "candidates": rec["candidates"] + 1}))
    f = whole_run_funnel(run)
    assert f["not_filtered"] == 2 and f["not_filtered_tasks"] == 1  # run.json's count (1) is the tasks'
    (run / "run.json").write_text(json.dumps({**rec, "candidates": rec["candidates"] + 1,
                                              "not_filtered_full_signature": 3}))
    with pytest.raises(ReleaseError, match="3 candidates not filtered"):
        whole_run_funnel(run)


def test_release_of_a_small_run_passes_its_checks_and_loads(run, tmp_path):
    steps = make_steps(run, tmp_path)
    out = tmp_path / "releases" / "tiny"
    res = assemble_release(run, None, out, compare=steps["compare"], recheck=steps["recheck"], version="1.1",
                           changelog=steps["changelog"])
    assert res["out"] == out and not list(out.parent.glob(".tiny.*"))  # no temporary folder left
    ds = load_dataset(str(out), split="train")
    selected = json.loads((run / "selection.json").read_text())["task_ids"]
    assert sorted(ds["task_id"]) == sorted(selected) and res["checks"]["rows"] == len(selected)
    for p in (run / "hf").rglob("*"):  # data and plots byte for byte
        if p.is_file() and p.parts[-2] in ("data", "plots"):
            assert (out / p.relative_to(run / "hf")).read_bytes() == p.read_bytes(), p
    assert res["checks"]["rows_per_variant_count"] == {"1": len(selected)}
    assert "packaged:kernelbench" in " ".join(res["checks"]["references"])

    card = (out / "README.md").read_text()
    f = res["funnel"]
    assert f"| accepted | {f['accepted']:,} |" in card and "| `trivial` | 1 |" in card
    assert f"{f['candidates']:,} candidates composed" in card and f"`{FP}`" in card
    assert "the run's own funnel" not in card  # the funnel section is recounted
    assert card.index("## Release") < card.index("## How to load")
    assert "Version **1.1**." in card and "### 1.1" in card and "- three tasks" in card
    for section in ("How this release was built", "Re-check", "Realism", "Side by side with reference"):
        assert f"\n## {section}\n" in card, section
    assert card.index("## Filter funnel") < card.index("## How this release was built") < card.index("## Licence")
    assert "| runtime_window | 1 | 1 | 50.0 % |" in card and "compile_agreement" not in card
    assert "The run was resumed" in card  # funnel.json says the last invocation resumed from the ledger
    assert "| share of rows with 9 ops |" not in card  # 0.0 % on both sides: left out
    assert "**not met**" in card and "`top_exotic_op_share`" in card  # 50 % > the 8 % target
    assert "| top_op_set_share | 1.0 % (add + layer_norm) | <= 2 % | met |" in card
    assert "| distinct_op_set_share | 100.0 % (3) | >= 20 % | met |" in card
    limits = card.split("\n## Limitations\n", 1)[1].split("\n## ", 1)[0]
    assert "Realism target `top_exotic_op_share` is not met: 50.0 % (cumsum) against" in limits
    assert "top_op_set_share" not in limits and "top_other_op_share" not in card  # an earlier card's note goes
    assert "`batch_p50`" not in limits  # a met target is not a limitation
    assert f"| filter fingerprint | `{FP}` |" in card
    assert "re-verdicted 2 of the 3 rows" in card
    meta = yaml.safe_load(card.split("---", 2)[1])
    assert meta["dataset_info"]["splits"][0]["num_examples"] == len(selected)

    prov = json.loads((out / "opforge_run.json").read_text())
    rel = prov["release"]
    assert rel["version"] == "1.1" and rel["changelog"].startswith("# 1.1")
    assert rel["funnel_whole_run"] == json.loads(json.dumps(f))
    assert rel["recheck"]["all_rules_pass"] == 1 and rel["comparison"]["names"] == ["run", "reference"]
    assert prov["config"]["target"] == 3  # the run's provenance is kept
    shipped = json.loads((out / "recheck.json").read_text())
    assert shipped["source"] == "recheck_sample.parquet"  # no folder of this machine
    assert str(tmp_path) not in "".join(p.read_text(errors="replace") for p in out.rglob("*.json"))

    # the same command again replaces the earlier release (same files)
    before = manifest(out)
    again = CliRunner().invoke(app, ["release", str(run), "--out", str(out), "--compare", str(steps["compare"]),
                                     "--recheck", str(steps["recheck"]), "--version", "1.1", "--changelog",
                                     str(steps["changelog"])], env=ENV)
    assert again.exit_code == 0, again.output
    assert f"wrote {out}" in again.output and manifest(out) == before


def _reformatted(code: str) -> str:
    """The same task in another layout: a comment and blank lines (equal normalised source)."""
    return "# copied\n\n" + code.replace("\n\n\n", "\n\n")


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_row_equal_to_an_excluded_reference_row_is_refused(run, tmp_path, kind):
    copied = SOURCES[SELECTED[1]]
    assert source_hash(_reformatted(copied)) == source_hash(copied)
    codes = [_kb_task("torch.cos(x)", "4"), _reformatted(copied)]
    ref = tmp_path / f"reference.{kind}"
    if kind == "parquet":
        pd.DataFrame({"code": codes}).to_parquet(ref)
    else:
        ref.write_text("".join(json.dumps({"code": c}) + "\n" for c in codes))
    out = tmp_path / "rel"
    with pytest.raises(ReleaseError) as err:
        assemble_release(run, None, out, references=["packaged:kernelbench", ref])
    msg = str(err.value)
    assert f"task {task_id_for(copied)} = {ref.name} row 1" in msg and str(ref) in msg
    assert str(out) in msg and not out.exists() and not list(tmp_path.glob(".rel.*"))
    res = CliRunner().invoke(app, ["release", str(run), "--out", str(out), "--exclude", str(ref)], env=ENV)
    assert res.exit_code == 2 and task_id_for(copied) in res.output and ref.name in res.output
    assert not out.exists()


def _earlier_release(run: Path, tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "rel"
    assemble_release(run, None, out)
    return out, manifest(out)


def test_bad_inputs_name_the_file_and_leave_out_untouched(run, tmp_path):
    out, before = _earlier_release(run, tmp_path)
    steps = make_steps(run, tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"names": ["a", ')
    cases = {
        "malformed compare": (dict(compare=bad), f"{bad}: not JSON"),
        "missing recheck": (dict(recheck=tmp_path / "nope.json"), f"{tmp_path / 'nope.json'}: no such file"),
        "not a recheck report": (dict(recheck=steps["compare"]), f"{steps['compare']}: not an `opforge recheck`"),
        "missing changelog": (dict(changelog=tmp_path / "CHANGES.md"), f"{tmp_path / 'CHANGES.md'}: no such file"),
    }
    for name, (kwargs, expected) in cases.items():
        with pytest.raises(ReleaseError) as err:
            assemble_release(run, None, out, **kwargs)
        assert expected in str(err.value), (name, str(err.value))
        assert manifest(out) == before, name
    with pytest.raises(ReleaseError, match="not a finished `opforge run` directory"):
        assemble_release(run / "hf", None, out)  # the wrong folder
    with pytest.raises(ReleaseError, match=f"{run}: not a dataset folder"):
        assemble_release(run, run, out)  # the run directory given as the published folder
    # a compare result of other rows than the released ones
    cmp = json.loads(steps["compare"].read_text())
    cmp["datasets"]["a"]["input"]["sha256"] = "0" * 64
    other = tmp_path / "other_compare.json"
    other.write_text(json.dumps(cmp))
    with pytest.raises(ReleaseError, match=f"{other}: its dataset A is not the rows of"):
        assemble_release(run, None, out, compare=other)
    # a run file missing, and run files that disagree: both named
    verdicts = run / "filter" / "verdicts.parquet"
    table = pd.read_parquet(verdicts)
    verdicts.rename(run / "filter" / "v.bak")
    with pytest.raises(ReleaseError, match=f"{verdicts}: no such file"):
        assemble_release(run, None, out)
    table.loc[table["reason"] == "trivial:noop", "reason"] = "trivial:identity"
    table.to_parquet(verdicts, index=False)
    with pytest.raises(ReleaseError) as err:
        assemble_release(run, None, out)
    assert f"{verdicts} and {run / 'filter' / 'ledger.jsonl'} disagree" in str(err.value)
    assert "trivial:identity" in str(err.value) and "trivial:noop" in str(err.value)
    assert manifest(out) == before
    res = CliRunner().invoke(app, ["release", str(run), "--out", str(out)], env=ENV)
    assert res.exit_code == 2 and res.output.startswith("error: ") and "disagree" in res.output


def test_out_is_replaced_only_when_it_is_a_release_and_the_cap_and_paths_are_checked(run, tmp_path):
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "todo.txt").write_text("mine")
    with pytest.raises(ReleaseError, match="not an earlier release"):
        assemble_release(run, None, keep)
    assert (keep / "todo.txt").read_text() == "mine" and len(list(keep.iterdir())) == 1
    with pytest.raises(ReleaseError, match="over the cap of 1,000"):
        assemble_release(run, None, tmp_path / "small", max_bytes=1000)
    assert not (tmp_path / "small").exists()
    prov = run / "hf" / "opforge_run.json"
    doc = json.loads(prov.read_text())
    doc["config"]["seeds_catalog"] = "/home/someone/seeds/catalog.parquet"
    prov.write_text(json.dumps(doc))
    with pytest.raises(ReleaseError) as err:
        assemble_release(run, None, tmp_path / "leak")
    assert f"{tmp_path / 'leak' / 'opforge_run.json'}: names a folder of the building machine" in str(err.value)
    assert "/home/" in str(err.value) and not (tmp_path / "leak").exists()


@pytest.mark.slow
def test_refresh_realism_rerenders_the_release_card_and_leaves_the_rows(tmp_path):
    """``refresh_realism`` on a copy of the shipped release: the Realism section and the realism notes of
    Limitations come from the new report (a retired target is no longer reported missed, only missed targets are
    named), the side-by-side table gains the three diversity rows for both datasets, the rows stay byte-identical."""
    import shutil

    from opforge.pipeline.release import refresh_realism
    from opforge.task.realism import check_targets

    src = Path(__file__).resolve().parents[1] / "releases" / "opforge-ops-6k"
    folder = tmp_path / "rel"
    shutil.copytree(src, folder)
    data = {p.name: p.read_bytes() for p in (folder / "data").glob("*.parquet")}
    rows = json.loads((folder / "opforge_run.json").read_text())["release"]["run"]["selected"]
    ours = {"rows": rows, "batch_p50": 128.0, "top_exotic_op": "embedding", "top_exotic_op_share": 0.05,
            "top_op_set": "layer_norm", "top_op_set_share": 0.03, "distinct_op_sets": 1500,
            "distinct_op_set_share": 0.25}
    theirs = {**ours, "top_exotic_op": "conv_transpose2d", "top_exotic_op_share": 0.13, "distinct_op_sets": 3000,
              "distinct_op_set_share": 0.5}
    for name, fig in (("a.json", ours), ("b.json", theirs)):
        (tmp_path / name).write_text(json.dumps({"figures": fig, "targets": check_targets(fig)}))
    with pytest.raises(ReleaseError, match="rows"):
        (tmp_path / "bad.json").write_text(json.dumps({"figures": {**ours, "rows": 5}, "targets": {}}))
        refresh_realism(folder, tmp_path / "bad.json")
    refresh_realism(folder, tmp_path / "a.json", tmp_path / "b.json")
    card = (folder / "README.md").read_text()
    assert "top_other_op_share" not in card
    realism = card.split("\n## Realism\n", 1)[1].split("\n## ", 1)[0]
    assert "| top_op_set_share | 3.0 % (layer_norm) | <= 2 % | **not met** |" in realism
    assert "| top_exotic_op_share | 5.0 % (embedding) | <= 8 % | met |" in realism
    limits = card.split("\n## Limitations\n", 1)[1].split("\n## ", 1)[0]
    assert "Realism target `top_op_set_share` is not met: 3.0 % (layer_norm) against <= 2 %" in limits
    assert limits.count("Realism target") == 1
    assert "| realism: top exotic op, share of rows (target <= 8 %; all rows) | embedding (5.0 %) | " \
           "conv_transpose2d (13.0 %) |" in card
    assert "| realism: distinct op sets, share of rows (target >= 20 %; all rows) | 1,500 (25.0 %) | 3,000 (50.0 %) |" \
        in card
    assert card.startswith("---\n") and "\n---\n\n# " in card
    assert {p.name: p.read_bytes() for p in (folder / "data").glob("*.parquet")} == data
    prov = json.loads((folder / "opforge_run.json").read_text())["release"]
    assert prov["realism"]["figures"]["top_op_set"] == "layer_norm"
    assert prov["comparison"]["diversity"]["b"]["distinct_op_sets"] == 3000

    # the statements the run once wrote as fixed prose are re-stated from the rows
    from opforge.pipeline.release import refresh_card_statements

    # the shipped card was refreshed with this function already: what it still changes is a subset of the
    # statements, and the statements below hold either way
    statements = ["data_source range", "motif libraries", "batch range", "size contexts", "selection note",
                  "plots/op_count.png"]
    assert set(refresh_card_statements(folder)) <= set(statements)
    assert set(refresh_card_statements(folder)) <= {"plots/op_count.png"}  # a second pass changes no text
    card = (folder / "README.md").read_text()
    frame = pd.concat([pd.read_parquet(p) for p in sorted((folder / "data").glob("*.parquet"))])
    ks = sorted(int(x.split("#")[1]) for x in set(frame["data_source"]) if x.startswith("torch#"))
    assert f"k = {ks[0]}-{ks[-1]} in these rows" in card and "1-5)" not in card
    batches = [json.loads(x)[0][0] for x in frame["input_shapes"]]
    assert f"First-input batch (first dim of the first input): {min(batches)} to {max(batches)}," in card
    assert "is at most 512" not in card and "most frequent op outside the common ones" not in card
    assert {p.name: p.read_bytes() for p in (folder / "data").glob("*.parquet")} == data
