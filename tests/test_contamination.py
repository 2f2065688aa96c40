"""The KernelBench contamination filter and the duplicate filter, in-process and through ``opforge filter``."""

import collections
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from opforge.filters.contamination import ContaminationFilter
from opforge.filters.duplicate import DuplicateFilter
from opforge.filters.kernelbench import (
    PACKAGED_COMMIT,
    PACKAGED_DIR,
    PACKAGED_SOURCE,
    ReferenceLoadError,
    build_index,
    default_reference,
    load_problems,
)
from opforge.filters.verdict import TaskInput
from opforge.task.structure import class_tokens, parse_task, static_op_signature

from .disguises import DISGUISES, changed
from .new_fusions import NEW_FUSIONS
from .paths import KERNELBENCH, OPS6K, needs_shared


@pytest.fixture(scope="module")
def problems():
    return load_problems()  # the packaged copy (levels 1-3), the same problems as ../shared/reference


@pytest.fixture(scope="module")
def contamination(problems):
    return ContaminationFilter(build_index())


def test_every_kernelbench_problem_is_contaminated_with_itself_nearest(problems, contamination):
    assert len(problems) == 250 and {p.level for p in problems} == {1, 2, 3}
    wrong = []
    for p in problems:
        v = contamination(p.code, p.key)
        if v.accepted or not v.reason.startswith("contaminated") or v.metrics["kernelbench_nearest"] != p.key:
            wrong.append((p.key, v.reason, v.metrics["kernelbench_nearest"]))
        assert v.metrics["kernelbench_similarity"] == 1.0 or wrong
    assert wrong == []


@pytest.mark.parametrize("disguise", sorted(DISGUISES))
def test_disguised_kernelbench_problems_are_rejected(disguise, problems, contamination):
    fn = DISGUISES[disguise]
    caught, total, changed_n = 0, 0, 0
    for p in problems:
        code = fn(p.code)
        changed_n += changed(p.code, code)
        total += 1
        caught += not contamination(code, p.key).accepted
    assert changed_n >= 0.9 * total  # the disguise really changed the source
    assert caught / total >= 0.95, f"{disguise}: {caught}/{total}"


def test_new_fusions_are_not_flagged(contamination):
    flagged = {}
    for name, code in NEW_FUSIONS.items():
        v = contamination(code, name)
        assert v.metrics["signature_source"] == "trace", (name, v.metrics["trace_error"])
        if not v.accepted:
            flagged[name] = (v.reason, v.metrics["kernelbench_nearest"])
    assert flagged == {}


def _relu_task(body: str, module: bool = False) -> str:
    init = "        self.act = nn.ReLU()\n" if module else ""
    fwd = "return self.act(v)" if module else body.replace("x", "v")
    return (f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\nclass Model(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__()\n{init}\n    def forward(self, v):\n"
            f"        {fwd}\n\nsize = 777\n\ndef get_inputs():\n    return [torch.randn(4, size)]\n\n"
            f"def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("spelling", ["torch.relu", "F.relu", "method", "module"])
def test_every_relu_spelling_matches_kernelbench_relu(spelling, contamination):
    code = _relu_task("return torch.relu(x)" if spelling in ("torch.relu", "module") else
                      "return F.relu(x)" if spelling == "F.relu" else "return x.relu()", module=spelling == "module")
    v = contamination(code)
    assert v.reason == "contaminated:op_signature" and v.metrics["signature"] == ["relu"]
    assert v.metrics["kernelbench_nearest"] == "L1/19_ReLU"


def test_linear_relu_chain_matches_kernelbench_mlp(contamination):
    code = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self, a, b):\n"
            "        super().__init__()\n        self.fc = nn.Linear(a, b)\n\n    def forward(self, x):\n"
            "        return torch.relu(self.fc(x))\n\ndef get_inputs():\n    return [torch.randn(8, 64)]\n\n"
            "def get_init_inputs():\n    return [64, 32]\n")
    v = contamination(code)
    assert v.reason == "contaminated:op_signature"
    assert v.metrics["signature"] == ["linear", "relu"] and "L3/1_MLP" in v.metrics["signature_matches"]


def test_untraceable_task_falls_back_to_the_static_signature(contamination):
    code = _relu_task("return torch.relu(x) if x.sum().item() > -1e9 else x")
    v = contamination(code)
    assert v.metrics["signature_source"] == "static" and "item()" in v.metrics["trace_error"]
    assert static_op_signature(parse_task(code)) == frozenset({"relu", "sum"})  # `>` on a Python float is no op


def test_structure_tokens_ignore_names_constants_and_spelling():
    a = _relu_task("return torch.relu(x) * 2.0")
    b = a.replace("torch.relu(v)", "F.relu(v)").replace("2.0", "3.5").replace("v", "inp").replace("777", "5")
    assert class_tokens(parse_task(a)) == class_tokens(parse_task(b))
    assert class_tokens(parse_task(a)) != class_tokens(parse_task(a.replace("torch.relu", "torch.tanh")))


def test_contamination_thresholds_are_re_decidable(contamination, problems):
    p = next(p for p in problems if p.key.startswith("L2/"))
    m = contamination.score(TaskInput(DISGUISES["combined"](p.code), "x"))
    only_structure = ContaminationFilter(contamination.index, tiers=["structure"], structure_min=1.01)
    assert only_structure.decide(m).accepted  # no tier left that can reject
    assert not contamination.decide(m).accepted
    with pytest.raises(ValueError, match="unknown tier"):
        ContaminationFilter(contamination.index, tiers=["ast"])


def test_duplicate_filter_keeps_first_of_exact_and_near_copies():
    base = NEW_FUSIONS["layernorm_hardswish_amax"]
    renamed = re.sub(r"\bx\b", "inp", base.replace("self.norm", "self.ln"))  # near: same ops, new names
    respelt = renamed.replace("F.hardswish(", "torch.nn.functional.hardswish(")
    commented = "# a copy\n" + base.replace("\n\n\n", "\n\n")  # exact after normalisation
    extra = base.replace(".amax(dim=-1)", ".amax(dim=-1).exp()")  # one more op: a different task
    rows = [base, renamed, commented, respelt, extra, NEW_FUSIONS["sort_diff_abs"], 42]
    verdicts = DuplicateFilter().run_corpus(rows)
    reasons = [v.reason for v in verdicts]
    assert reasons == [None, "duplicate:near", "duplicate:exact", "duplicate:near", None, None, None]
    assert verdicts[2].metrics["duplicate_of"] == 0 and verdicts[1].metrics["duplicate_of"] == 0
    assert verdicts[1].metrics["jaccard"] >= 0.9
    assert [v.reason for v in DuplicateFilter(near=False).run_corpus(rows)][1] is None


@needs_shared
def test_ops6k_exact_duplicates_are_all_found():
    codes = list(pd.read_parquet(OPS6K, columns=["code"])["code"])
    verdicts = DuplicateFilter(near=False).run_corpus(codes)
    seen, byte_identical = set(), []
    for i, c in enumerate(codes):
        if c in seen:
            byte_identical.append(i)
        seen.add(c)
    exact = {i for i, v in enumerate(verdicts) if v.reason == "duplicate:exact"}
    assert len(byte_identical) == 352  # docs/DESIGN.md §6
    assert set(byte_identical) <= exact  # and more: copies differing only in comments or layout
    counts = collections.Counter(v.reason for v in verdicts)
    assert counts["duplicate:exact"] == len(exact) > 352


@needs_shared
def test_packaged_reference_is_kernelbench_at_its_commit(problems):
    """The copy shipped as package data is the reference file's problems (same commit), levels 1-4."""
    packaged = load_problems(levels=(1, 2, 3, 4))
    assert default_reference() == PACKAGED_SOURCE  # tests run with OPFORGE_KERNELBENCH unset
    assert len(packaged) == 270
    assert [(p.key, p.code) for p in packaged] == [(p.key, p.code) for p in load_problems(KERNELBENCH, (1, 2, 3, 4))]
    prov = json.loads((PACKAGED_DIR / "PROVENANCE.json").read_text())
    assert prov["commit"] == PACKAGED_COMMIT and prov["problems_per_level"] == {"1": 100, "2": 100, "3": 50, "4": 20}
    assert "MIT License" in (PACKAGED_DIR / "LICENSE").read_text()


def test_filter_command_decontaminates_with_the_packaged_reference_offline(tmp_path, problems):
    """No --kernelbench, no $OPFORGE_KERNELBENCH, an empty index cache, no network: the packaged copy is used."""
    by_key = {p.key: p for p in problems}
    relu = by_key["L1/19_ReLU"]
    rows = [{"code": NEW_FUSIONS["cumsum_exp_mean"]}, {"code": DISGUISES["combined"](relu.code)},
            {"code": NEW_FUSIONS["cumsum_exp_mean"]}, {"code": NEW_FUSIONS["atan2_remainder"]},
            {"code": by_key["L2/1_Conv2D_ReLU_BiasAdd"].code}, {"code": by_key["L3/1_MLP"].code}]
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_KERNELBENCH"}
    env.update(OPFORGE_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "filter", str(src), str(tmp_path / "run"),
                          "--only", "contamination,duplicate", "--workers", "1", "--quiet"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    v = pd.read_parquet(tmp_path / "run" / "verdicts.parquet").set_index("row")
    assert v["reason"].fillna("ok").tolist() == ["ok", "contaminated:op_signature", "duplicate:exact", "ok",
                                                 "contaminated:exact", "contaminated:exact"]
    assert v.loc[1, "kernelbench_nearest"] == "L1/19_ReLU" and v.loc[0, "kernelbench_similarity"] < 0.9
    assert v.loc[4, "kernelbench_nearest"] == "L2/1_Conv2D_ReLU_BiasAdd" and v.loc[5, "kernelbench_nearest"] == "L3/1_MLP"
    funnel = json.loads((tmp_path / "run" / "funnel.json").read_text())
    assert funnel["settings"]["kernelbench_identity"]["source"] == PACKAGED_SOURCE
    assert funnel["by_filter"]["eager"]["ran"] == 0 and funnel["by_filter"]["duplicate"]["ran"] == 6
    assert (tmp_path / "run" / "kernelbench_index.pkl").exists()
    assert list((tmp_path / "cache" / "kernelbench").glob("index-*.pkl"))  # built here, from the package


def test_an_explicit_reference_overrides_the_packaged_one(tmp_path, problems):
    """--kernelbench (here: a file of level 1 only) replaces the default reference."""
    src = tmp_path / "kb.jsonl"
    src.write_text("".join(json.dumps({"level": p.level, "problem_id": p.problem_id, "name": p.name, "code": p.code})
                           + "\n" for p in problems if p.key in ("L1/19_ReLU", "L1/23_Softmax")))
    index = build_index(src, levels=(1,))
    assert index.problems == ["L1/19_ReLU", "L1/23_Softmax"] and index.identity()["source"] == str(src)
    with pytest.raises(ReferenceLoadError, match="no problem at levels"):
        load_problems(src, levels=(2,))
    with pytest.raises(ReferenceLoadError, match="unknown packaged reference"):
        load_problems("packaged:kernelbench@00000000")
