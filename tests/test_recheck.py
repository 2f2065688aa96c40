"""``opforge recheck`` on CPU: a tiny Hub folder whose rows break one rule each, re-run through the filters."""

import json

import numpy as np
import pandas as pd
import pytest
from opforge.pipeline.filter_run import InputError
from opforge.pipeline.recheck import RULES, format_report, read_published, recheck, recheck_settings

from .filter_tasks import BAD, GOOD

ROWS = {"good": GOOD, "non_finite": BAD["non_finite"], "zeros": BAD["degenerate_output:all_zeros"],
        "reseed": BAD["nondeterministic:reseed"]}


def _hub_folder(path):
    data = path / "data"
    data.mkdir(parents=True)
    rows = pd.DataFrame({"task_id": list(ROWS), "code": list(ROWS.values()), "ops": ['["nn.Linear"]'] * len(ROWS),
                         "data_source": ["torch#1"] * len(ROWS), "eager_ms": [0.05, 0.04, 0.03, 0.02],
                         "gpu": ["cpu"] * len(ROWS)})
    rows.to_parquet(data / "train-00000-of-00001.parquet", index=False)
    return path, rows


@pytest.mark.slow  # one filter run on CPU (a Dask worker and a sandbox child starting torch)
def test_recheck_reports_each_rule_and_resumes(tmp_path):
    src, rows = _hub_folder(tmp_path / "hf")
    settings = recheck_settings("cpu", None, skip=["compile"])
    rep = recheck(src, tmp_path / "out", settings, workers=1, progress=False)
    r = rep["rules"]
    assert (r["eager"]["pass"], r["eager"]["fail"]) == (4, 0)
    assert (r["finite"]["pass"], r["finite"]["fail"]) == (3, 1)
    assert (r["deterministic"]["pass"], r["deterministic"]["fail"], r["deterministic"]["not_reached"]) == (2, 1, 1)
    assert (r["non_degenerate"]["pass"], r["non_degenerate"]["fail"]) == (1, 1)
    assert r["non_degenerate"]["pass_rate"] == 0.5
    assert r["compile_agreement"] == {"checked": False}
    assert (r["runtime_window"]["pass"], r["runtime_window"]["not_reached"]) == (1, 3)
    assert rep["all_rules_pass"] == 1 and rep["device"] == {"recheck": "cpu", "published": {"cpu": 4}, "same": True}
    assert {(f["task_id"], f["rule"]) for f in rep["failures"]} == {
        ("non_finite", "finite"), ("zeros", "non_degenerate"), ("reseed", "deterministic")}
    # the ratio is the measured eager time of the one row that reached the runtime filter / its published one
    verdicts = pd.read_parquet(tmp_path / "out" / "filter" / "verdicts.parquet")
    measured = verdicts.set_index("task_id")["eager_ms"]["good"]
    assert rep["eager_ratio"]["n"] == 1
    assert rep["eager_ratio"]["p50"] == pytest.approx(measured / 0.05, rel=1e-3)
    assert json.loads((tmp_path / "out" / "recheck.json").read_text())["rules"] == r
    assert "non_degenerate" in format_report(rep)

    again = recheck(src, tmp_path / "out", settings, workers=1, progress=False)
    assert again["resumed_from_ledger"] == 4 and again["rules"] == r


@pytest.mark.parametrize(("accepted", "filt", "reason", "reached", "expected"), [
    (True, None, None, {"static", "eager", "runtime"}, ["pass"] * 6),
    (False, "eager", "non_finite", {"static", "eager"},
     ["pass", "fail", "not_reached", "not_reached", "not_reached", "not_reached"]),
    (False, "eager", "timeout", {"static"}, ["fail"] + ["not_reached"] * 5),
    (False, "compile", "compile_mismatch", {"static", "eager", "runtime_screen", "determinism", "degenerate",
                                             "compile"},
     ["pass", "pass", "pass", "pass", "fail", "not_reached"]),
    (False, "runtime_screen", "runtime_out_of_window:too_fast", {"static", "eager", "runtime_screen"},
     ["pass", "pass", "not_reached", "not_reached", "not_reached", "fail"]),
])
def test_rule_outcomes(accepted, filt, reason, reached, expected):
    ran = list(recheck_settings("cuda", (1.0, 100.0)).names())
    assert [rule.outcome(accepted, filt, reason, reached, ran) for rule in RULES] == expected


def test_read_published_errors(tmp_path):
    with pytest.raises(InputError, match="no data/"):
        read_published(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        read_published(tmp_path / "missing.parquet")
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "rows.parquet")
    with pytest.raises(InputError, match="no `code` column"):
        read_published(tmp_path / "rows.parquet")
    (tmp_path / "rows.jsonl").write_text('{"task_id": "0012", "code": "x", "eager_ms": 1.5}\n')
    read = read_published(tmp_path / "rows.jsonl")
    assert read["task_id"].tolist() == ["0012"] and read["eager_ms"].tolist() == [1.5]  # values as written
    (tmp_path / "bad.jsonl").write_text('{"code": "x"}\nnot json\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: not a JSON object"):
        read_published(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="not a recheck filter"):
        recheck_settings("cpu", None, skip=["duplicate"])


def test_ratio_ignores_rows_without_a_measurement():
    from opforge.pipeline.recheck import eager_ratio

    rows = pd.DataFrame({"eager_ms": [2.0, 4.0, 1.0, None]})
    verdicts = pd.DataFrame({"row": [0, 1, 2, 3], "eager_ms": [3.0, 4.0, None, 5.0]})
    rep = eager_ratio(rows, verdicts)
    assert rep["n"] == 2 and rep["p50"] == pytest.approx(float(np.median([1.5, 1.0])))


def test_a_sample_is_drawn_at_random_the_same_way_each_time():
    from opforge.pipeline.recheck import rows_to_recheck

    rows = pd.DataFrame({"task_id": [f"t{i:03d}" for i in range(200)], "code": ["x"] * 200})
    a, how = rows_to_recheck(rows, sample=50, seed=7)
    b, _ = rows_to_recheck(rows, sample=50, seed=7)
    c, _ = rows_to_recheck(rows, sample=50, seed=8)
    assert list(a.task_id) == list(b.task_id) and set(a.task_id) != set(c.task_id)
    assert len(a) == 50 and a.task_id.is_unique and list(a.index) == sorted(a.index)  # file order
    assert list(a.task_id) != list(rows.task_id[:50])  # not the first rows
    assert how == {"rows": 50, "of": 200, "how": "50 at random, seed 7"}
    assert rows_to_recheck(rows, sample=500)[1]["how"] == "all" and len(rows_to_recheck(rows, limit=3)[0]) == 3
    with pytest.raises(ValueError, match="not both"):
        rows_to_recheck(rows, limit=3, sample=3)
    with pytest.raises(ValueError, match="--sample must be >= 1"):
        rows_to_recheck(rows, sample=0)
