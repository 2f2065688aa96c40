"""``opforge run`` end to end on CPU, the Hub folder it builds, resume after a kill, and ``opforge publish``."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from datasets import load_dataset
from opforge.filters.duplicate import DuplicateFilter
from opforge.pipeline import select
from opforge.pipeline.hub_folder import manifest, validate_folder
from opforge.pipeline.publish import PublishError, publish
from opforge.pipeline.run_config import ConfigError, RunConfig, default_device_profile, load_config
from opforge.pipeline.select import bucket_shares, plan_quotas, select_tasks
from opforge.task.source import load_task
from opforge.task.trace import trace_task

from .paths import OPS6K, needs_shared

TARGET = 6
MEASURED = ["eager_ms", "compile_ms"]  # timings: measured again by every run, so never compared


def _run_cmd(out: Path, catalog: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "opforge.pipeline.cli", "run", "--target", str(TARGET), "--out", str(out),
            "--seeds-catalog", str(catalog), "--seed", "3", "--workers", "2", "--timeout-s", "120", *extra]


@pytest.fixture(scope="module")
def finished_run(catalog_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "a"
    proc = subprocess.run(_run_cmd(out, catalog_path), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def ops6k_style_loader(path_or_id: str, **kw):
    """A loader written for CUDA-Agent-Ops-6K: only its three columns. (Ops-6K's 71 transformers rows hold
    a bare class name in ``ops``, not JSON, so such a loader must accept both.)"""
    ds = load_dataset(path_or_id, split="train", **kw)
    return [(json.loads(r["ops"]) if r["ops"].startswith("[") else [r["ops"]], r["data_source"], r["code"])
            for r in ds]


def test_run_builds_a_loadable_dataset(finished_run):
    hf = finished_run / "hf"
    ds = load_dataset(str(hf), split="train")
    assert len(ds) == TARGET
    card = (hf / "README.md").read_text()
    assert "configs:" in card and "dataset_info:" in card and f"num_examples: {TARGET}" in card
    assert {f.name for f in (hf / "plots").iterdir()} == {"op_count.png", "top_ops.png", "runtime.png",
                                                        "kernelbench_similarity.png"}
    run = json.loads((finished_run / "run.json").read_text())
    assert run["selected"] == TARGET and run["accepted"] <= run["candidates"]
    # both workers' sandboxes started while the composer worked, and the filter stage used them: the first
    # task of each worker started no child of its own
    assert run["sandbox_warm_up"]["started"] == run["sandbox_warm_up"]["of"] == 2, run["sandbox_warm_up"]
    first = {}
    for line in (finished_run / "filter" / "ledger.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "task_id" in rec:
            first.setdefault(rec["worker"], rec)
    assert len(first) == 2 and all(r["start_s"] == 0.0 for r in first.values()), first
    # the card states what the run measured (its funnel: "N candidates (M distinct task ids) composed in ...")
    assert f"{run['candidates']} candidates (" in card and "composed in" in card
    assert validate_folder(hf)["rows"] == TARGET
    ours = ops6k_style_loader(str(hf))
    assert len(ours) == TARGET
    assert all(isinstance(ops, list) and ops and src.startswith(("torch#", "transformers")) for ops, src, _ in ours)
    assert all(isinstance(json.loads(o), list) for o in ds["ops"])  # ours is JSON in every row
    # hidden shape variants: a JSON list per row (batch-only here: the test profile has no size context)
    variants = [json.loads(v) for v in ds["shape_variants"]]
    assert sum(len(v) >= 2 for v in variants) >= TARGET // 2, variants
    assert all(set(x["sizes"]) == {"batch_size"} for v in variants for x in v)
    assert "## Hidden shape variants" in card


@needs_shared
def test_an_ops6k_loader_reads_the_reference_and_ours_alike(finished_run):
    ref = ops6k_style_loader("parquet", data_files=str(OPS6K))
    ours = ops6k_style_loader(str(finished_run / "hf"))
    assert len(ref) == 6000 and len(ours) == TARGET
    assert {type(ops) for ops, _, _ in ref} == {type(ops) for ops, _, _ in ours} == {list}


def test_every_published_row_passes_an_independent_recheck(finished_run):
    rows = pd.read_parquet(finished_run / "hf" / "data")
    for r in rows.itertuples():
        task = load_task(r.code, r.task_id)
        torch.manual_seed(0)
        out = task.build().eval()(*task.inputs())
        outs = out if isinstance(out, (tuple, list)) else [out]
        assert all(torch.isfinite(t).all() for t in outs if isinstance(t, torch.Tensor)), r.task_id
        labels = {lab for op in trace_task(load_task(r.code, r.task_id)) for lab in op.labels}
        for label in json.loads(r.ops):  # every listed op is one the code calls
            assert label in labels or r.data_source == "transformers", (r.task_id, label, labels)
        # the run records the installed distribution's version: a PyPI CUDA wheel's is "2.13.0" while its
        # torch.__version__ is "2.13.0+cu130", so compare the public version
        assert r.gpu == "cpu" and r.torch_version.split("+")[0] == torch.__version__.split("+")[0]
        assert r.num_ops == len(json.loads(r.ops))


@needs_shared
def test_no_published_row_copies_an_ops6k_row(finished_run):
    ref = list(pd.read_parquet(OPS6K, columns=["code"])["code"])
    ours = list(pd.read_parquet(finished_run / "hf" / "data")["code"])
    verdicts = DuplicateFilter().run_corpus(ref + ours)
    copied = [v.metrics for v in verdicts[len(ref):] if not v.accepted and v.metrics["duplicate_of"] < len(ref)]
    assert copied == []


def test_killed_run_resumes_to_the_same_dataset(finished_run, catalog_path, tmp_path):
    out = tmp_path / "b"
    proc = subprocess.Popen(_run_cmd(out, catalog_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    ledger = out / "filter" / "ledger.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "hf").exists()
    done_before = len(ledger.read_text().splitlines())
    again = subprocess.run(_run_cmd(out, catalog_path), capture_output=True, text=True, timeout=1500)
    assert again.returncode == 0, again.stderr[-3000:]
    a = pd.read_parquet(finished_run / "hf" / "data").drop(columns=MEASURED)
    b = pd.read_parquet(out / "hf" / "data").drop(columns=MEASURED)
    pd.testing.assert_frame_equal(a, b)
    lines = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip().endswith("}")]
    assert len(lines) == len({x["task_id"] for x in lines}) >= done_before  # nothing verdicted twice


class FakeHfApi:
    """Records calls; ``fail_uploads`` makes that many uploads raise first."""

    def __init__(self, fail_uploads: int = 0):
        self.calls, self.fail_uploads, self.uploaded = [], fail_uploads, None

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, *, folder_path, repo_id, **kw):
        self.calls.append(("upload_folder", repo_id, kw))
        if self.fail_uploads:
            self.fail_uploads -= 1
            raise OSError("connection reset")
        self.uploaded = manifest(folder_path)
        return type("Commit", (), {"oid": "abc123", "commit_url": f"https://hub/{repo_id}/commit/abc123"})()

    def create_tag(self, repo_id, **kw):
        self.calls.append(("create_tag", repo_id, kw))


def test_published_folder_holds_no_path_of_the_building_machine(finished_run, catalog_path):
    """The run was given absolute paths (--out, --seeds-catalog under pytest's temporary folder): no file of
    the Hub folder (card, provenance, shards, plots) names the run directory, the repository, the home folder
    or the temporary folder, and the provenance identifies the catalog by name and hash instead."""
    hf = finished_run / "hf"
    repo = Path(__file__).resolve().parents[1]
    needles = {str(finished_run.resolve()), str(finished_run), str(repo), str(Path.home()),
               str(Path(catalog_path).resolve().parent)}
    files = [p for p in hf.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".md", ".json", ".parquet", ".png"}
    for path in files:
        blob = path.read_bytes()
        for needle in needles:
            assert needle.encode() not in blob, (path.relative_to(hf), needle)
    config = json.loads((hf / "opforge_run.json").read_text())["config"]
    assert config["out"] == "."
    assert re.fullmatch(r"catalog\.parquet \(sha256 [0-9a-f]{16}\)", config["seeds_catalog"]), config["seeds_catalog"]
    assert config["kernelbench"] is None  # the packaged default; the funnel names it
    status = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "status", str(finished_run), "--json"],
                            capture_output=True, text=True, timeout=120)
    s = json.loads(status.stdout)
    assert s["stage"] == "finished" and s["result"]["selected"] == TARGET and s["hub_folder"] == str(hf)
    run = json.loads((finished_run / "run.json").read_text())
    assert s["candidates"]["rows"] == run["candidates"] and s["ledger"]["accepted"] == run["accepted"]


def test_publish_uploads_exactly_the_validated_folder(finished_run):
    api = FakeHfApi(fail_uploads=1)
    res = publish(finished_run, "org/ops", private=True, revision="v1-branch", tag="v1.0", api=api, backoff_s=0)
    names = [c[0] for c in api.calls]
    assert names == ["create_repo", "create_branch", "upload_folder", "upload_folder", "create_tag"]
    assert api.calls[0][2] == {"repo_type": "dataset", "private": True, "exist_ok": True}
    assert api.calls[-1][2]["revision"] == "abc123" and api.calls[-1][2]["tag"] == "v1.0"
    assert api.uploaded == validate_folder(finished_run / "hf")["manifest"]
    assert res.commit == "abc123" and res.files == len(api.uploaded)


def test_publish_errors_are_clear(finished_run, tmp_path, monkeypatch):
    with pytest.raises(PublishError, match="not a dataset folder"):
        publish(tmp_path, "org/ops", api=FakeHfApi())
    with pytest.raises(PublishError, match="nothing was committed"):
        publish(finished_run, "org/ops", api=FakeHfApi(fail_uploads=5), attempts=2, backoff_s=0)
    with pytest.raises(PublishError, match="ORG/NAME"):
        publish(finished_run, "ops", api=FakeHfApi())
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(PublishError, match="no Hugging Face token"):
        publish(finished_run, "org/ops")


def test_config_file_errors_and_run_identity(tmp_path, finished_run):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("target: 50\nseed: 9\nop_mix: uniform\n")
    cfg = load_config(cfg_file, {"target": 7, "workers": None})
    assert (cfg.target, cfg.seed, cfg.op_mix) == (7, 9, "uniform")  # the command line wins
    cfg_file.write_text("target: 5\ntargt: 6\n")
    with pytest.raises(ConfigError, match=r"run.yaml: targt"):
        load_config(cfg_file, {})
    cfg_file.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(cfg_file, {})
    saved = load_config(finished_run / "config.yaml", {})
    assert saved.seed == 3 and saved.round_size >= 16 and saved.device_profile == "cpu"
    out = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "run", "--out", str(finished_run),
                          "--seed", "4", "--target", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "other seed" in out.stderr


def test_gpu_sharing_options_reach_the_filter_settings(tmp_path):
    from opforge.pipeline.run import _filter_settings

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("device: cuda\ngpu_step_limit_s: 3\ncompile_threads: 2\ncompile_autotune: true\n")
    s = _filter_settings(load_config(cfg_file, {}).resolved())
    assert (s.gpu_step_limit_s, s.compile_threads) == (3.0, 2)
    assert s.thresholds == {"compile": {"autotune": True}}  # and so part of the ledger fingerprint
    assert _filter_settings(RunConfig().resolved()).thresholds == {}
    assert s.gpu_growth == _filter_settings(RunConfig().resolved()).gpu_growth  # unset: the stage's default
    cfg_file.write_text("gpu_growth: 0.5\n")
    with pytest.raises(ConfigError, match="gpu_growth"):
        load_config(cfg_file, {})


def test_every_gpu_sharing_option_is_a_setting_a_config_key_and_a_filter_option():
    """``GPU_SHARING_OPTIONS`` is the one list both commands pass on: each name is a FilterSettings field, a
    RunConfig key and an ``opforge filter`` option, and a bad value given there is refused by FilterSettings
    with exit code 2, naming the field."""
    from opforge.filters.chain import GPU_SHARING_OPTIONS, FilterSettings
    from opforge.pipeline.cli import app
    from typer.testing import CliRunner

    assert set(GPU_SHARING_OPTIONS) <= set(FilterSettings.model_fields) & set(RunConfig.model_fields)
    runner = CliRunner()
    for name in GPU_SHARING_OPTIONS:
        flag = "--" + name.replace("_", "-")
        out = runner.invoke(app, ["filter", "missing.parquet", "--out", "unused", flag, "-1"])
        assert out.exit_code == 2 and name in out.output, (name, out.output)


def test_threshold_overrides_merge_config_and_command_line(tmp_path):
    """The config file's ``thresholds`` and ``--threshold`` texts merge per filter and key (the command
    line wins); a malformed text is a ConfigError; a misspelt key stops the run before it writes anything."""
    from opforge.pipeline.run import _filter_settings, run_pipeline

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("compile_autotune: true\nthresholds:\n  degenerate: {max_err: 0.5}\n"
                        "  runtime: {budget_s: 0.05, max_trials: 20}\n")
    cfg = load_config(cfg_file, {}, thresholds=["runtime.budget_s=0.01", "determinism.max_drift=0.05"])
    assert _filter_settings(cfg.resolved()).thresholds == {
        "degenerate": {"max_err": 0.5}, "runtime": {"budget_s": 0.01, "max_trials": 20},
        "determinism": {"max_drift": 0.05}, "compile": {"autotune": True}}
    assert cfg.thresholds["runtime"]["budget_s"] == 0.01  # what config.yaml records
    cfg_file.write_text("compile_autotune: true\nthresholds: {compile: {autotune: false}}\n")
    assert _filter_settings(load_config(cfg_file, {}).resolved()).thresholds == {"compile": {"autotune": True}}
    with pytest.raises(ConfigError, match="expected FILTER.KEY=VALUE"):
        load_config(None, {}, thresholds=["runtime:budget_s=0.01"])
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"filter 'runtime' has no threshold\(s\) \['budgt_s'\]"):
        run_pipeline(RunConfig(out=out, thresholds={"runtime": {"budgt_s": 0.01}}), progress=False)
    assert not out.exists()


def test_selection_quota_cap_and_coverage():
    rows = []
    for i in range(40):  # 30 two-op tasks over 3 signatures, 10 three-op tasks over 10 signatures
        k = 2 if i < 30 else 3
        ops = ["nn.Conv2d", ["F.relu", "F.gelu", "torch.tanh"][i % 3]] if k == 2 else [f"op{i}", "a", "b"]
        rows.append({"task_id": f"t{i}", "ops": json.dumps(ops), "data_source": f"torch#{k}",
                     "categories": json.dumps(["conv"])})
    pool = pd.DataFrame(rows)
    shares = bucket_shares({2: 0.5, 3: 0.5}, 0.0)
    sel = select_tasks(pool, 10, shares, seed=1, max_per_signature=2)
    assert sel.shortfall == 0 and sel.picked == {"torch#2": 5, "torch#3": 5}
    two = sel.rows[sel.rows.data_source == "torch#2"]["ops"].map(lambda s: json.loads(s)[1])
    assert set(two) == {"F.relu", "F.gelu", "torch.tanh"} and two.value_counts().max() <= 2
    # a short bucket hands its shortfall to the others
    q, notes = plan_quotas(10, {"torch#1": 0.5, "torch#2": 0.5}, {"torch#1": 2, "torch#2": 50})
    assert q == {"torch#1": 2, "torch#2": 8} and "torch#1" in notes[0]
    assert select_tasks(pool, 10, shares, seed=1).rows["task_id"].tolist() == \
        select_tasks(pool, 10, shares, seed=1).rows["task_id"].tolist()
    assert RunConfig(target=10).resolved().candidate_budget == 200
    # the signature cap grows with large targets (3 up to 4,500 tasks, one more per 1,500 above); a given one wins
    caps = {n: RunConfig(target=n).resolved().max_per_signature for n in (10, 4500, 4501, 6000, 7501)}
    assert caps == {10: 3, 4500: 3, 4501: 4, 6000: 4, 7501: 6}
    assert RunConfig(target=6000, max_per_signature=2).resolved().max_per_signature == 2


def test_run_selection_takes_its_bucket_shares_from_the_op_mix():
    """``pipeline.run.run_selection``: the ``models`` op mix keeps the pool's own op-count mix; a fixed op mix
    sets the buckets' shares itself."""
    from opforge.pipeline.run import run_selection

    rows = [{"task_id": f"t{i}", "ops": json.dumps([f"op{i}", "F.relu"]), "data_source": f"torch#{2 if i < 30 else 3}",
             "categories": json.dumps(["activation"])} for i in range(40)]  # pool mix 3:1
    pool = pd.DataFrame(rows)
    models = run_selection(pool, RunConfig(target=20, max_op_share=None).resolved())
    assert models.shortfall == 0 and models.picked == {"torch#2": 15, "torch#3": 5}
    even = run_selection(pool, RunConfig(target=20, op_mix="2:0.5,3:0.5", transformers_share=0.0,
                                         max_op_share=None).resolved())
    assert even.picked == {"torch#2": 10, "torch#3": 10}
    assert run_selection(pool.iloc[:0], RunConfig(target=20).resolved()).shortfall == 20  # an empty pool


def test_selection_cap_counts_each_dtype_of_a_fusion_apart():
    """The cap is per (op set, dtype): the bfloat16 twin of a capped float32 fusion is still selectable, and
    rows without a dtype column count as float32."""
    rows = [{"task_id": f"t{i}", "ops": json.dumps(["nn.Linear", "F.gelu"]), "data_source": "torch#2",
             "dtype": ["float32", "bfloat16"][i % 2]} for i in range(8)]
    pool = pd.DataFrame(rows)
    shares = bucket_shares({2: 1.0}, 0.0)
    sel = select_tasks(pool, 8, shares, seed=0, max_per_signature=2)
    assert len(sel.rows) == 4 and sel.rows["dtype"].value_counts().to_dict() == {"float32": 2, "bfloat16": 2}
    assert sel.shortfall == 4 and "4 accepted tasks left out" in sel.notes[-1]
    assert len(select_tasks(pool.drop(columns="dtype"), 8, shares, max_per_signature=2).rows) == 2


def test_selection_soft_cap_on_heavy_tasks():
    """Rule 4: heavy tasks (GEMM / conv / attention / RNN labels) fill at most max_heavy_share of a quota while
    other tasks remain, then fill what the others cannot; None keeps the selection as without the rule."""
    from opforge.pipeline.select import heavy_flags

    heavy_ops = [["nn.Linear", "F.gelu"], ["F.conv2d", "torch.relu"], ["torch.matmul", "F.softmax"],
                 ["F.scaled_dot_product_attention", "Tensor.mul"], ["nn.LSTM", "torch.tanh"], ["@", "torch.sigmoid"]]
    light_ops = [["torch.sort", "F.softmax"], ["Tensor.mul", "F.layer_norm"], ["torch.cumsum", "F.silu"]]
    rows = [{"task_id": f"h{i}", "ops": json.dumps(heavy_ops[i % 6] + [f"x{i}"]), "data_source": "torch#3"}
            for i in range(30)]
    rows += [{"task_id": f"l{i}", "ops": json.dumps(light_ops[i % 3] + [f"y{i}"]), "data_source": "torch#3"}
             for i in range(6)]
    pool = pd.DataFrame(rows)
    assert heavy_flags(pool) == [True] * 30 + [False] * 6
    shares = bucket_shares({3: 1.0}, 0.0)
    capped = select_tasks(pool, 12, shares, seed=0, max_heavy_share=0.5)
    assert capped.shortfall == 0
    assert capped.rows["task_id"].str.startswith("h").sum() == 6  # 6 light tasks, heavy ones up to 50 %
    assert "50.0%" in capped.notes[-1] and capped.light_short == 0
    # too few light tasks: the quota is filled with heavy ones, and the note says the cap was not held
    short = select_tasks(pool, 20, shares, seed=0, max_heavy_share=0.5)
    assert short.shortfall == 0 and (~short.rows["task_id"].str.startswith("h")).sum() == 6
    assert "too few other" in short.notes[-1]
    assert short.light_short == 14 - 10  # 14 heavy chosen, 10 allowed
    off = select_tasks(pool, 12, shares, seed=0)
    assert off.light_short == 0
    assert off.rows["task_id"].tolist() == select_tasks(pool, 12, shares, seed=0, max_heavy_share=1.0).rows[
        "task_id"].tolist()
    with pytest.raises(ValueError, match="max_heavy_share"):
        select_tasks(pool, 12, shares, max_heavy_share=1.5)
    assert RunConfig(target=10).max_heavy_share == 0.75


def test_selection_soft_floor_on_fusion_gain():
    """Rule 5: tasks whose fusion_gain is below soft_min_fusion_gain are chosen only where the others cannot fill
    the quota; within a signature the ones above it come first; rows without a gain count as above it."""
    rows = [{"task_id": f"w{i}", "ops": json.dumps(["nn.Linear", f"x{i}"]), "data_source": "torch#2",
             "fusion_gain": 1.02} for i in range(6)]
    rows += [{"task_id": f"s{i}", "ops": json.dumps(["nn.Linear", f"y{i}"]), "data_source": "torch#2",
              "fusion_gain": 2.5 if i < 3 else None} for i in range(4)]
    # one signature, its first task (by rank) weak: the strong ones are its first max_per_signature
    rows += [{"task_id": f"g{i}", "ops": json.dumps(["F.softmax", "Tensor.mul"]), "data_source": "torch#2",
              "fusion_gain": [1.0, 3.0, 3.0, 3.0][i]} for i in range(4)]
    pool = pd.DataFrame(rows)
    shares = bucket_shares({2: 1.0}, 0.0)
    sel = select_tasks(pool, 7, shares, seed=0, soft_min_fusion_gain=1.1)
    assert sorted(sel.rows["task_id"]) == ["g1", "g2", "g3", "s0", "s1", "s2", "s3"]
    assert "fusion gain below 1.1: 0 of those chosen, 7 in the pool" in sel.notes
    more = select_tasks(pool, 10, shares, seed=0, soft_min_fusion_gain=1.1)  # the floor never leaves a quota short
    assert more.shortfall == 0 and more.rows["task_id"].str.startswith("w").sum() == 3
    off = select_tasks(pool, 7, shares, seed=0)
    assert (off.rows["fusion_gain"] < 1.1).sum() > 0  # without the rule, this seed takes weak tasks
    assert RunConfig(target=10).soft_min_fusion_gain == 1.1


def test_selection_spreads_the_ops_it_cannot_hold_under_the_cap():
    """Rule 7 water-fills: a task whose most-chosen op outside the common ones is in the fewest chosen tasks goes
    first, also once the cap cannot hold, so the excess is spread over the ops instead of piling on one."""
    rows = [{"task_id": f"{op}{i}", "ops": json.dumps([f"F.{op}", "Tensor.add", f"F.u{op}{i}"]),
             "data_source": "torch#2", "fusion_gain": 2.0} for op in ("a", "b", "c") for i in range(12)]
    pool = pd.DataFrame(rows)
    shares = bucket_shares({2: 1.0}, 0.0)
    for seed in range(4):
        sel = select_tasks(pool, 12, shares, seed=seed, max_op_share=0.2)  # 2 per op, 12 to choose from 3 ops
        assert sel.shortfall == 0
        assert sorted(sel.rows["task_id"].str[0].value_counts().tolist()) == [4, 4, 4]
    # rule 7 off: nothing spreads them (seeded order)
    counts = [select_tasks(pool, 12, shares, seed=seed).rows["task_id"].str[0].value_counts().max()
              for seed in range(4)]
    assert max(counts) > 4


def test_selection_soft_cap_on_one_exotic_op():
    """Rule 7: once an exotic op (task.realism.op_kind: not layout, common or a building block) is in
    floor(N * max_op_share) chosen tasks, tasks with it are chosen only where the others cannot fill the quota;
    layout ops (reshape) and building blocks (layer_norm) are free, and a module's dimension suffix does not
    split an op (nn.BatchNorm1d and nn.BatchNorm2d are one batch_norm, a building block)."""
    rows = [{"task_id": f"c{i}", "ops": json.dumps(["Tensor.reshape", "torch.cumsum", f"F.u{i}"]),
             "data_source": "torch#3", "fusion_gain": 2.0} for i in range(20)]
    rows += [{"task_id": f"n{i}", "ops": json.dumps(["Tensor.reshape", "nn.LayerNorm", f"F.v{i}"]),
              "data_source": "torch#3", "fusion_gain": 2.0} for i in range(60)]
    pool = pd.DataFrame(rows)
    assert select.exotic_ops(pool.iloc[[0, 20]]) == [frozenset({"cumsum", "u0"}), frozenset({"v0"})]
    assert select.op_sets(pd.DataFrame({"ops": [json.dumps(["nn.BatchNorm1d", "Tensor.view", "+"]),
                                                json.dumps(["nn.BatchNorm2d", "Tensor.permute", "Tensor.add"])]})) \
        == [frozenset({"batch_norm", "add"})] * 2
    shares = bucket_shares({3: 1.0}, 0.0)
    for seed in range(3):
        sel = select_tasks(pool, 50, shares, seed=seed, max_op_share=0.08, max_op_set_share=0.02)
        assert sel.shortfall == 0
        assert sel.rows["task_id"].str.startswith("c").sum() <= 4  # 8 % of 50; 25 % of the pool
    assert any(n.startswith("most frequent exotic op: ") and "(soft cap 8%)" in n for n in sel.notes)
    # the cap never leaves a quota short: past what the others fill, tasks over it are taken
    full = select_tasks(pool, 70, shares, seed=0, max_op_share=0.08)
    assert full.shortfall == 0 and any("too few other accepted tasks to hold it" in n for n in full.notes)
    with pytest.raises(ValueError, match="max_op_share"):
        select_tasks(pool, 10, shares, max_op_share=-0.1)
    with pytest.raises(ValueError, match="max_op_set_share"):
        select_tasks(pool, 10, shares, max_op_set_share=1.5)
    assert RunConfig(target=10).max_op_share == 0.08 and RunConfig(target=10).max_op_set_share == 0.02


def test_selection_soft_cap_on_one_op_set():
    """Rule 7: once an op set (the task's ops without the layout ones) is in floor(N * max_op_set_share) chosen
    tasks, tasks with it wait, even when every op of it is free (layer_norm + add); layout ops and dtypes do not
    make another op set."""
    layouts = [["Tensor.view"], ["Tensor.permute"], ["Tensor.transpose"], ["Tensor.reshape", "Tensor.contiguous"],
               ["Tensor.unsqueeze"], ["Tensor.view", "Tensor.permute"], ["Tensor.flatten"], ["Tensor.squeeze"],
               ["Tensor.expand"], ["Tensor.narrow"]]
    rows = [{"task_id": f"s{k}{d}", "ops": json.dumps(["nn.LayerNorm", *lay, "Tensor.add"]), "dtype": dtype,
             "data_source": "torch#3", "fusion_gain": 2.0}
            for k, lay in enumerate(layouts) for d, dtype in enumerate(("float32", "bfloat16", "float16"))]
    rows += [{"task_id": f"o{i}", "ops": json.dumps(["nn.GELU", "Tensor.mul", f"F.w{i}"]),
              "data_source": "torch#3", "fusion_gain": 2.0} for i in range(150)]
    pool = pd.DataFrame(rows)
    assert len(set(select.op_sets(pool.iloc[:30]))) == 1
    shares = bucket_shares({3: 1.0}, 0.0)
    for seed in range(3):
        sel = select_tasks(pool, 100, shares, seed=seed, max_op_share=0.08, max_op_set_share=0.02)
        assert sel.shortfall == 0
        assert sel.rows["task_id"].str.startswith("s").sum() <= 2  # 2 % of 100; 17 % of the pool
    assert any("most frequent op set: add + layer_norm in 2.0% of those chosen (soft cap 2%" in n for n in sel.notes)
    # without the op-set cap this pool puts more of them in
    assert select_tasks(pool, 100, shares, seed=0, max_op_share=0.08).rows["task_id"].str.startswith("s").sum() > 2


def test_selection_hard_cap_on_random_composer_tasks():
    """Rule 6: at most floor(N * max_random_share) chosen tasks come from the random composer (no motif or block
    provenance), those above the fusion-gain floor first; the cap leaves the selection short rather than
    filling it with more of them."""
    motif = json.dumps({"motif_id": "m", "category": "norm"})
    rows = [{"task_id": f"m{i}", "ops": json.dumps(["F.layer_norm", f"a{i}"]), "data_source": "torch#2",
             "provenance": motif, "fusion_gain": 2.0} for i in range(6)]
    rows += [{"task_id": "b0", "ops": json.dumps(["F.gelu", "b"]), "data_source": "torch#2",
              "provenance": json.dumps({"block": "llama", "source": "x"}), "fusion_gain": 2.0}]
    rows += [{"task_id": f"r{i}", "ops": json.dumps(["torch.cumsum", f"r{i}"]), "data_source": "torch#2",
              "provenance": "" if i % 2 else None, "fusion_gain": 1.0 if i < 2 else 3.0} for i in range(6)]
    rows += [{"task_id": "x0", "ops": json.dumps(["torch.sin", "x"]), "data_source": "torch#2",
              "provenance": "{not json", "fusion_gain": 2.0}]  # unreadable provenance: not counted as random
    pool = pd.DataFrame(rows)
    assert select.random_composed(pool) == [False] * 7 + [True] * 6 + [False]
    shares = bucket_shares({2: 1.0}, 0.0)
    sel = select_tasks(pool, 10, shares, seed=0, soft_min_fusion_gain=1.1, max_random_share=0.2)
    chosen = set(sel.rows["task_id"])
    assert {f"m{i}" for i in range(6)} | {"b0", "x0"} <= chosen
    assert len(chosen) == 10 and sel.shortfall == 0
    assert chosen & {"r0", "r1"} == set()  # the two random ones kept are above the floor
    assert any("4 accepted random-composer tasks left out by the cap of 20% of 10 (2 tasks)" in n for n in sel.notes)
    short = select_tasks(pool, 13, shares, seed=0, max_random_share=0.2)
    assert short.shortfall == 3 and short.rows["task_id"].str.startswith("r").sum() == 2
    off = select_tasks(pool, 14, shares, seed=0)
    assert off.shortfall == 0
    assert select_tasks(pool.drop(columns="provenance"), 14, shares, max_random_share=0.0).shortfall == 0
    with pytest.raises(ValueError, match="max_random_share"):
        select_tasks(pool, 10, shares, max_random_share=1.2)
    assert RunConfig(target=10).max_random_share == 0.15
    from opforge.pipeline.run import random_cap

    assert random_cap(RunConfig(target=10)) == 0.15  # motif share 0.9
    assert random_cap(RunConfig(target=10, motif_share=0.0)) == 1.0  # a random-composer run keeps its rows
    assert random_cap(RunConfig(target=10, max_random_share=None)) is None


def test_run_and_compose_default_to_the_composers_motif_share():
    """``opforge run`` (RunConfig), ``opforge compose`` (its option) and the composer share one default."""
    import inspect

    from opforge.compose.composer import DEFAULT_MOTIF_SHARE, ComposeConfig
    from opforge.pipeline.cli import compose_cmd

    assert RunConfig(target=10).motif_share == ComposeConfig(n=1).motif_share == DEFAULT_MOTIF_SHARE
    assert inspect.signature(compose_cmd).parameters["motif_share"].default.default == DEFAULT_MOTIF_SHARE


def test_rounds_after_the_target_hold_the_heavy_cap():
    """Composing stops once the target is met and the heavy-op cap held; while the cap is not held it goes on for
    at most ``cap_rounds`` rounds, which filter no heavy-op candidate; a short target always goes on."""
    from opforge.pipeline.run import cap_round, target_stop

    heavy = [{"task_id": f"h{i}", "ops": json.dumps(["nn.Linear", f"x{i}"]), "data_source": "torch#2"}
             for i in range(10)]
    light = [{"task_id": f"l{i}", "ops": json.dumps(["F.softmax", f"y{i}"]), "data_source": "torch#2"}
             for i in range(10)]
    shares = bucket_shares({2: 1.0}, 0.0)
    cfg = RunConfig(target=8, cap_rounds=2)
    held = select_tasks(pd.DataFrame(heavy + light[:3]), 8, shares, max_heavy_share=0.75)
    over = select_tasks(pd.DataFrame(heavy + light[:1]), 8, shares, max_heavy_share=0.75)
    short = select_tasks(pd.DataFrame(heavy[:3] + light[:1]), 8, shares, max_heavy_share=0.75)
    assert (held.shortfall, held.light_short, over.shortfall, over.light_short) == (0, 0, 0, 1)
    assert not cap_round(None) and not cap_round(held) and cap_round(over) and not cap_round(short)
    assert target_stop(held, cfg, 100, 0) == "target of 8 reached after 100 candidates"
    assert target_stop(over, cfg, 100, 0) == "" and target_stop(over, cfg, 150, 1) == ""
    assert "2 more round(s)" in target_stop(over, cfg, 200, 2) and "still 1 tasks" in target_stop(over, cfg, 200, 2)
    assert "1 more round(s)" in target_stop(held, cfg, 150, 1) and target_stop(held, cfg, 150, 1).endswith("held")
    assert target_stop(short, cfg, 100, 0) == "" and target_stop(short, cfg, 10**6, 5) == ""
    assert target_stop(over, RunConfig(target=8, cap_rounds=0), 100, 0).endswith("short")
    # the cap holds over the whole selection: a bucket of whole model blocks (always heavy) does not keep it going
    blocks = [{"task_id": f"b{i}", "ops": json.dumps(["LlamaMLP"]), "data_source": "transformers"} for i in range(2)]
    mixed = select_tasks(pd.DataFrame(heavy + light + blocks), 10, {"torch#2": 0.8, "transformers": 0.2},
                         max_heavy_share=0.75)
    assert mixed.picked["transformers"] == 2 and mixed.light_short == 0 and not cap_round(mixed)


@pytest.mark.slow
def test_vocabulary_harvest_runs_in_a_child_beside_the_probes(tmp_path):
    """``start_vocabulary_harvest`` writes a loadable vocabulary from a spawned child (the run overlaps it with
    the seed-op probes); the parent never imports the families' configs for it."""
    from opforge.seeds.vocabulary import AXES, load_vocabulary, start_vocabulary_harvest

    path = tmp_path / "shape_vocabulary.json"
    executor, fut = start_vocabulary_harvest(path)
    try:
        assert fut.result(timeout=600) == str(path)
    finally:
        executor.shutdown()
    vocab = load_vocabulary(path)
    assert len(vocab.models) > 100 and all(vocab.values(a) for a in ("hidden", "seq", "heads", "channels"))
    assert set(vocab.axes) == set(AXES)


def test_candidates_of_a_full_signature_are_not_filtered():
    """``capped_out``: a new round's candidates whose (data_source, op set, dtype) already holds the cap of accepted
    tasks are skipped; another dtype, another bucket or a signature below the cap is filtered; and selecting from
    the accepted pool with or without them gives as many tasks."""
    from opforge.pipeline.select import capped_out, full_signatures

    def row(i, ops, dtype="float32", source="torch#2"):
        return {"task_id": f"t{i}", "ops": json.dumps(ops), "data_source": source, "dtype": dtype}

    accepted = pd.DataFrame([row(i, ["nn.Linear", "F.gelu"]) for i in range(3)]
                            + [row(10, ["nn.Conv2d", "F.relu"])])
    new = pd.DataFrame([row(20, ["F.gelu", "nn.Linear"]), row(21, ["nn.Linear", "F.gelu"], "bfloat16"),
                        row(22, ["nn.Linear", "F.gelu"], source="torch#3"), row(23, ["nn.Conv2d", "F.relu"]),
                        row(1, ["nn.Linear", "F.gelu"])])
    assert full_signatures(accepted, 3) == {("torch#2", json.dumps([["F.gelu", "nn.Linear"], "float32"]))}
    assert capped_out(new, accepted, 3) == {"t20"}
    assert capped_out(new, accepted, 4) == set() and capped_out(new, accepted, 1) == {"t20", "t23"}
    shares = bucket_shares({2: 1.0}, 0.0)
    both = pd.concat([accepted, new[new.task_id.isin(capped_out(new, accepted, 3))]], ignore_index=True)
    assert len(select_tasks(both, 10, shares, max_per_signature=3).rows) == \
        len(select_tasks(accepted, 10, shares, max_per_signature=3).rows)


def test_the_default_profile_follows_the_device_and_the_gpu(monkeypatch):
    assert default_device_profile("cpu", "NVIDIA H200") == "cpu"
    assert default_device_profile("cuda", "NVIDIA H200") == "h200"
    assert default_device_profile("cuda", "NVIDIA H100 80GB HBM3") == "h100"
    assert default_device_profile("cuda", "NVIDIA A100-SXM4-80GB") == "h100"  # no profile of its own
    import opforge.engine.ledger as ledger

    monkeypatch.setattr(ledger, "visible_gpu_name", lambda: "NVIDIA H200")
    assert RunConfig(device="cuda").resolved().device_profile == "h200"
    assert RunConfig(device="cuda", device_profile="h100").resolved().device_profile == "h100"
    assert RunConfig(device="cpu").resolved().device_profile == "cpu"
