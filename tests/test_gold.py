"""The gold subset (pipeline/gold.py: the rule; `opforge gold select`) and its publication as the ``gold``
configuration of a release folder (pipeline/gold_release.py; `opforge gold release`), on synthetic rows, a fake
result directory of `opforge harness eval` and a copy of the shipped release."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.batch import result_key
from opforge.pipeline.cli import app
from opforge.pipeline.gold import GOLD_DTYPES, GOLD_STRATA, gold_subset
from opforge.pipeline.gold_release import GOLD_END, GOLD_START, write_gold
from typer.testing import CliRunner

RELEASE = Path(__file__).resolve().parents[1] / "releases" / "opforge-ops-6k"


def _rows(n_per: int = 12) -> pd.DataFrame:
    """n_per rows per (stratum, dtype) inside the window, plus rows outside it and outside every stratum."""
    rows = []
    for s in GOLD_STRATA:
        for d in GOLD_DTYPES:
            for i in range(n_per):
                prov = None if s == "random_composer" else json.dumps({"category": s})
                rows.append({"task_id": f"{s}-{d}-{i}", "provenance": prov, "data_source": "torch#3",
                             "dtype": d, "eager_ms": 0.05 + 0.3 * i})
            rows.append({"task_id": f"{s}-{d}-slow", "provenance": None if s == "random_composer" else
                         json.dumps({"category": s}), "data_source": "torch#3", "dtype": d, "eager_ms": 7.0})
    rows.append({"task_id": "block", "provenance": None, "data_source": "transformers#bert", "dtype": "float32",
                 "eager_ms": 1.0})
    return pd.DataFrame(rows)


def test_rule_is_deterministic_stratified_and_independent_of_row_order():
    rows = _rows()
    a = gold_subset(rows)
    b = gold_subset(rows.sample(frac=1.0, random_state=3).reset_index(drop=True))
    assert a.to_dict("records") == b.to_dict("records")
    assert len(a) == 6 * len(GOLD_STRATA) and list(a["stratum"].unique()) == list(GOLD_STRATA)
    for s in GOLD_STRATA:  # dtypes take turns: float32, bfloat16, float16, float32, ...
        assert list(a[a["stratum"] == s]["dtype"]) == [*GOLD_DTYPES, *GOLD_DTYPES]
    assert a["eager_ms"].between(0.04, 5.0).all() and "block" not in set(a["task_id"])
    assert gold_subset(rows, seed=1)["task_id"].tolist() != a["task_id"].tolist()  # the seed decides the draw


def test_rule_skips_a_dtype_the_stratum_lacks_and_names_bad_input():
    rows = _rows(3)
    rows = rows[~(rows["task_id"].str.startswith("norm-") & (rows["dtype"] != "float32"))]
    got = gold_subset(rows)
    assert list(got[got["stratum"] == "norm"]["dtype"]) == ["float32"] * 3
    with pytest.raises(ValueError, match="eager_ms"):
        gold_subset(rows.drop(columns="eager_ms"))
    bad = rows.copy()
    bad.loc[bad.index[0], "provenance"] = "{not json"
    with pytest.raises(ValueError, match="provenance is not JSON"):
        gold_subset(bad)


def test_gold_select_prints_and_writes_the_rule_and_its_rows(tmp_path):
    path = tmp_path / "rows.parquet"
    _rows(4).to_parquet(path)
    res = CliRunner().invoke(app, ["gold", "select", str(path), "--seed", "7", "--out", str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    assert "seed 7" in res.output and "42 rows" in res.output
    written = json.loads((tmp_path / "g.json").read_text())
    assert written["seed"] == 7 and [r["task_id"] for r in written["rows"]] == \
        gold_subset(_rows(4), seed=7)["task_id"].tolist()
    bad = CliRunner().invoke(app, ["gold", "select", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "no release folder" in bad.output


def _fake_release(tmp_path: Path) -> Path:
    """A copy of the shipped release folder (card and data) to write the gold configuration into."""
    out = tmp_path / "release"
    out.mkdir()
    shutil.copy(RELEASE / "README.md", out / "README.md")
    shutil.copytree(RELEASE / "data", out / "data")
    return out


@pytest.mark.slow
def test_gold_release_writes_a_loadable_second_configuration(tmp_path):
    import datasets

    release = _fake_release(tmp_path)
    rows = pd.concat([pd.read_parquet(p) for p in sorted((release / "data").glob("*.parquet"))])
    gold = gold_subset(rows)
    code = dict(zip(rows["task_id"], rows["code"], strict=True))
    sols, results = tmp_path / "solutions", tmp_path / "results"
    results.mkdir()
    records = []
    a, b, c = gold["task_id"][:3]
    for tid in (a, b, c):
        (sols / tid / "kernels").mkdir(parents=True)
        (sols / tid / "model_new.py").write_text("import opforge_kernels\n")
        (sols / tid / "kernels" / "k.cu").write_text(f"// {tid}\n")
    files = {t: {"model_new.py": "import opforge_kernels\n", "kernels/k.cu": f"// {t}\n"} for t in (a, b, c)}
    roof = float(rows.set_index("task_id").loc[a, "roofline_ms"])
    records.append({"key": result_key({"task_id": a, "code": code[a]}, files[a]), "task_id": a, "status": "correct",
                    "reward": 3.0, "eager_ms": 1.0, "compile_ms": 0.5, "candidate_ms": 0.25, "speedup_eager": 4.0,
                    "speedup_compile": 2.0, "variants_checked": 2})
    records.append({"key": result_key({"task_id": b, "code": code[b]}, files[b]), "task_id": b,
                    "status": "incorrect", "reward": -1.0, "error": "max error 3.0"})
    # c's only result is of other files: never served for the shipped solution
    records.append({"key": result_key({"task_id": c, "code": code[c]}, {"model_new.py": "old"}), "task_id": c,
                    "status": "correct", "reward": 3.0, "candidate_ms": 0.1, "speedup_eager": 9.0})
    (results / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut')
    (results / "environment.json").write_text(json.dumps({"gpus": [{"name": "NVIDIA H200"}]}))

    res = CliRunner().invoke(app, ["gold", "release", str(results), "--solutions", str(sols), "--out", str(release)])
    assert res.exit_code == 0, res.output
    g = datasets.load_dataset(str(release), "gold", split="train").to_pandas().set_index("task_id")
    assert len(g) == len(gold) and set(g.index) == set(gold["task_id"])
    assert g.loc[a, "status"] == "correct" and g.loc[a, "reward"] == 3.0 and g.loc[a, "gpu"] == "NVIDIA H200"
    assert g.loc[a, "pct_roofline"] == pytest.approx(100 * roof / 0.25)
    assert json.loads(g.loc[a, "files"]) == files[a]
    assert g.loc[b, "status"] == "incorrect" and pd.isna(g.loc[b, "speedup_eager"])
    assert g.loc[c, "status"] == "not_evaluated" and g.loc[c, "reward"] == -1.0
    assert (g.drop(index=[a, b, c])["status"] == "missing").all()
    assert len(datasets.load_dataset(str(release), split="train")) == len(rows)  # the default config unchanged
    card = (release / "README.md").read_text()
    assert card.count(GOLD_START) == 1 and "geomean speed-up over torch.compile (correct rows) | 2.00x" in card
    # a re-run replaces the section and keeps one configs entry
    write_gold(release, sols, results)
    card = (release / "README.md").read_text()
    assert card.count(GOLD_START) == 1 and card.count(GOLD_END) == 1 and card.count("config_name: gold") == 1
    assert card.count("\n## Evaluation contract") == 1


def test_card_section_explains_rows_above_the_roofline():
    from opforge.pipeline.gold_release import card_section, gold_figures

    def row(tid, dtype, pct):
        return {"task_id": tid, "stratum": "gemm_epilogue", "dtype": dtype, "files": {}, "status": "correct",
                "reward": 3.0, "correct": True, "variants_checked": 2, "eager_ms": 1.0, "compile_ms": 0.8,
                "candidate_ms": 0.5, "speedup_eager": 2.0, "speedup_compile": 1.6, "roofline_ms": pct / 200,
                "pct_roofline": pct, "gpu": "NVIDIA H200", "error": None}

    below = pd.DataFrame([row("a" * 16, "float32", 40.0), row("b" * 16, "bfloat16", 60.0)])
    assert "Above 100 %" not in card_section(below, gold_figures(below))
    above = pd.DataFrame([row("a" * 16, "float32", 130.0), row("b" * 16, "bfloat16", 60.0)])
    text = card_section(above, gold_figures(above))
    assert "Above 100 % of the roofline (" + "a" * 16 + ")" in text and "TF32" in text
    assert "b" * 16 not in text.split("Above 100 %")[1]
