"""The committed release ``releases/opforge-ops-6k`` (opforge-Ops-6K): it loads with ``datasets`` as a user would,
and its data, card and provenance agree with each other. CPU only, no reference data needed."""

import ast
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from datasets import load_dataset
from opforge.pipeline.hub_folder import COLUMNS

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "releases" / "opforge-ops-6k"
MIN_ROWS = 5500  # the release issue's floor


@pytest.fixture(scope="module")
def ds():
    return load_dataset(str(RELEASE), split="train")


@pytest.fixture(scope="module")
def card():
    text = (RELEASE / "README.md").read_text(encoding="utf-8")
    _, fm, body = text.split("---", 2)
    return yaml.safe_load(fm), body


@pytest.fixture(scope="module")
def provenance():
    return json.loads((RELEASE / "opforge_run.json").read_text())


def test_loads_with_the_published_columns_and_unique_ids(ds, card):
    meta, _ = card
    rows = meta["dataset_info"]["splits"][0]["num_examples"]
    assert len(ds) == rows >= MIN_ROWS
    assert list(ds.column_names) == [name for name, *_ in COLUMNS]
    assert {f["name"]: f["dtype"] for f in meta["dataset_info"]["features"]} == \
        {name: dtype for name, _, dtype, _ in COLUMNS}
    assert len(set(ds["task_id"])) == rows
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in ds["task_id"])
    assert all(isinstance(json.loads(o), list) and json.loads(o) for o in ds["ops"])
    assert all(re.fullmatch(r"torch#[1-9]|transformers", s) for s in set(ds["data_source"]))
    # data_source names the op count of a torch row
    assert all(s == "transformers" or int(s[6:]) == n for s, n in zip(ds["data_source"], ds["num_ops"], strict=True))


def test_the_harness_loads_it_by_task_id(ds):
    from opforge.harness.dataset import load_tasks

    tasks = load_tasks(RELEASE)
    assert len(tasks) == len(ds) and tasks.index.is_unique
    assert set(tasks.index) == set(ds["task_id"])
    i = random.Random(1).randrange(len(ds))
    assert tasks.loc[ds[i]["task_id"], "code"] == ds[i]["code"]


def test_rows_are_the_selected_tasks(ds, provenance):
    selection = provenance["selection"]
    assert set(ds["task_id"]) == set(selection["task_ids"])
    assert Counter(ds["data_source"]) == Counter(selection["picked"])


def test_every_row_has_parsable_shape_variants_and_the_card_counts_them(ds, card):
    _, body = card
    per = Counter()
    for raw, shapes in zip(ds["shape_variants"], ds["input_shapes"], strict=True):
        variants = json.loads(raw)
        assert isinstance(variants, list)
        for v in variants:
            assert set(v) == {"sizes", "input_shapes", "work_ratio"}
            assert v["sizes"] and all(isinstance(n, int) and n > 0 for n in v["sizes"].values())
            assert v["input_shapes"] != json.loads(shapes)  # a variant changes the public shape
            assert 0 < v["work_ratio"] <= 2.0
        per[len(variants)] += 1
    with_two = sum(n for k, n in per.items() if k >= 2)
    assert f"{with_two} of {len(ds)} tasks have 2 variants or more" in body


def test_card_numbers_equal_the_data_and_the_provenance(ds, card, provenance):
    meta, body = card
    funnel = provenance["release"]["funnel_whole_run"]
    assert funnel["candidates"] == provenance["funnel"]["candidates"] == sum(funnel["candidates_per_round"])
    assert funnel["accepted"] == provenance["funnel"]["accepted"] >= len(ds)
    assert funnel["filtered"] + funnel["not_filtered"] == funnel["candidates"]
    assert funnel["accepted"] + sum(funnel["by_reason"].values()) == funnel["filtered"]
    assert funnel["ledger_verdicts"] + funnel["corpus_verdicts"] == funnel["filtered"]
    assert f"{funnel['candidates']:,} candidates composed" in body
    assert f"{funnel['accepted']:,} passed every filter" in body
    assert f"{len(ds):,} were selected" in body
    assert f"| accepted | {funnel['accepted']:,} |" in body
    for reason, n in funnel["by_reason"].items():
        assert f"| `{reason}` | {n:,} |" in body
    recheck = json.loads((RELEASE / "recheck.json").read_text())
    assert f"{recheck['all_rules_pass']:,} of {recheck['rows']:,} pass every rule" in body
    assert {f["task_id"] for f in recheck["failures"]} <= set(ds["task_id"])
    version = provenance["release"]["version"]
    assert version and f"Version **{version}**." in body
    assert "opforge-ops-6k-v1.0" in body  # the changelog names where the previous version stays
    gains = sorted(g for g in ds["fusion_gain"] if g is not None)
    row = re.search(r"(?m)^\| `fusion_gain` \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", body)
    assert gains and row, "the card's Headroom table has no fusion_gain p10 / p50 / p90 row"
    for shown, q in zip(row.groups(), (0.1, 0.5, 0.9), strict=True):  # shown to 2 decimals or 3 significant digits
        assert abs(float(shown) - _q(gains, q)) <= max(0.005, 0.005 * _q(gains, q)), (shown, q)
    for section in ("Release", "How to load", "Filter funnel", "How this release was built", "Re-check", "Realism",
                    "Headroom", "Hidden shape variants", "Side by side with cuda_agent_ops_6k"):
        assert f"\n## {section}\n" in body, section
    assert 'load_dataset("releases/opforge-ops-6k", split="train")' in (REPO / "README.md").read_text()


def _q(values: list[float], q: float) -> float:
    """The card's quantile (numpy's default linear interpolation)."""
    import numpy as np

    return float(np.quantile(values, q))


def test_no_file_names_a_folder_of_the_building_machine(ds):
    needles = [str(REPO).encode(), str(Path.home()).encode()]
    pattern = re.compile(rb"(/work/|/home/|/root/|/tmp/|/Users/)")
    files = [p for p in RELEASE.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".md", ".json", ".parquet", ".png"}
    assert sum(p.stat().st_size for p in files) < 50_000_000
    for path in files:
        blob = path.read_bytes()
        assert not any(n in blob for n in needles), path
        if path.suffix != ".parquet":  # compressed: its strings are checked through the loaded rows below
            assert not pattern.search(blob), path
    for col in ("code", "graph", "ops", "size_context"):
        assert not any(pattern.search(s.encode()) for s in ds[col] if s), col


def test_a_sample_of_rows_compiles_and_defines_the_task(ds):
    import torch

    for i in random.Random(0).sample(range(len(ds)), 8):
        code = ds[i]["code"]
        compile(code, f"row{i}", "exec")
        top = {n.name for n in ast.parse(code).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        assert {"Model", "get_inputs", "get_init_inputs"} <= top, (i, top)
        namespace = {}
        exec(compile(code, f"row{i}", "exec"), namespace)  # definitions only: nothing is built or run
        assert issubclass(namespace["Model"], torch.nn.Module)
        assert callable(namespace["get_inputs"]) and callable(namespace["get_init_inputs"])
