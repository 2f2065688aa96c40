"""The execution engine (engine/): its place in the layers, and the keys and fingerprints of its ledger."""

import ast
import json
from pathlib import Path

import pytest
from opforge.engine.ledger import Ledger
from opforge.harness.batch import eval_fingerprint, result_key
from opforge.harness.evaluate import EvalConfig

ROOT = Path(__file__).resolve().parent.parent


def _imports(folder: str) -> dict[str, set[str]]:
    """Module file -> the opforge stages it imports (static and function-level imports alike)."""
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        stages = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            stages |= {n.split(".")[1] for n in names if n.startswith("opforge.") and n.count(".") >= 1}
        out[str(path.relative_to(ROOT / folder))] = stages
    return out


def test_engine_imports_no_stage_above_it_and_harness_no_filters_or_pipeline():
    for name, stages in _imports("engine").items():
        assert stages <= {"engine", "task"}, f"engine/{name} imports {sorted(stages - {'engine', 'task'})}"
    for name, stages in _imports("harness").items():
        assert not stages & {"filters", "pipeline", "compose", "seeds"}, f"harness/{name} imports {sorted(stages)}"
    # the CLI, and the gold release (it publishes the harness's results of reference solutions), reach the harness
    harness_users = {("pipeline", "cli.py"), ("pipeline", "gold_release.py")}
    for folder in ("filters", "pipeline"):
        for name, stages in _imports(folder).items():
            assert "harness" not in stages or (folder, name) in harness_users, f"{folder}/{name}"


def test_eval_results_are_keyed_by_content_and_fingerprinted_by_settings(tmp_path):
    task = {"task_id": "t", "code": "class Model: pass\n"}
    files = {"model_new.py": "x = 1\n"}
    key = result_key(task, files)
    assert key.startswith("t-") and key == result_key(dict(task), dict(files))
    assert result_key(task, {"model_new.py": "x = 2\n"}) != key  # a fixed solution is a new result
    assert result_key({**task, "code": "class Model: ...\n"}, files) != key  # so is a changed task
    base = EvalConfig()
    fp = eval_fingerprint(base)
    assert fp == eval_fingerprint(EvalConfig())
    for changed in (EvalConfig(reward="speedup"), EvalConfig(atol=0.05), EvalConfig(profile_compile=False)):
        assert eval_fingerprint(changed) != fp
    led = Ledger(tmp_path / "results.jsonl", fp, key="key")
    led.append({"key": key, "task_id": "t", "status": "correct"})
    led.close()
    assert list(Ledger(tmp_path / "results.jsonl", fp, key="key").done) == [key]
    assert Ledger(tmp_path / "results.jsonl", eval_fingerprint(EvalConfig(rtol=0.5)), key="key").done == {}


def test_engine_settings_are_declared_once_and_reach_cli_run_config_and_eval(tmp_path):
    """``opforge filter`` / ``opforge run`` options and run-config keys come from ``EngineSettings``: same
    names, bounds and help; the harness's ``EvalConfig`` shares its GPU admission fields."""
    from opforge.engine.settings import GPU_SHARING_OPTIONS, SANDBOX_OPTIONS, EngineSettings, GpuAdmission
    from opforge.pipeline.cli import app
    from opforge.pipeline.run_config import ConfigError, RunConfig, load_config
    from typer.testing import CliRunner

    names = SANDBOX_OPTIONS + GPU_SHARING_OPTIONS
    assert set(names) <= set(RunConfig.model_fields)
    for name in names:  # one declaration: the run config's field carries the engine's bounds and help
        assert RunConfig.model_fields[name].description == EngineSettings.model_fields[name].description
    assert {"gpu_memory_fraction", "gpu_admit_gib", "gpu_growth", "device"} <= set(EvalConfig.model_fields)
    assert issubclass(EvalConfig, GpuAdmission)
    with pytest.raises(ConfigError, match="gpu_growth"):
        load_config(None, {"gpu_growth": 0.5})
    runner = CliRunner()
    for command in ("filter", "run"):
        out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "GPU sharing" in out and "Sandbox" in out, out
        assert all(f"--{n.replace('_', '-')}" in out for n in names), out
    src = tmp_path / "t.jsonl"
    src.write_text('{"code": "x = 1\\n"}\n')
    bad = runner.invoke(app, ["filter", str(src), "--out", str(tmp_path / "r"), "--gpu-growth", "0.5"])
    assert bad.exit_code == 2 and "gpu_growth" in bad.output, bad.output
    ok = runner.invoke(app, ["filter", str(src), "--out", str(tmp_path / "r"), "--only", "static",
                             "--timeout-s", "30", "--workers", "1"])
    assert ok.exit_code == 0, ok.output
    funnel = json.loads((tmp_path / "r" / "funnel.json").read_text())
    assert funnel["settings"]["timeout_s"] == 30.0 and funnel["rejected_tasks"] == 1


def test_a_worker_stops_its_sandboxes_all_at_once():
    """``SandboxPool.teardown`` closes every sandbox of the worker concurrently (each close waits for its child
    to exit; one after the other those waits add up): here three closes meet at a barrier, which closes run one
    after the other would never reach."""
    import threading

    from opforge.engine.pool import SandboxPool

    barrier = threading.Barrier(3, timeout=10)
    closed: list[int] = []

    class Box:
        def __init__(self, i):
            self.i = i

        def close(self):
            barrier.wait()  # BrokenBarrierError if the closes ran one after the other
            closed.append(self.i)

    pool = SandboxPool("opforge.engine.sandbox_child.SandboxJob", {})
    pool._all = [Box(i) for i in range(3)]
    pool._idle = list(pool._all[:1])
    pool.teardown(None)
    assert sorted(closed) == [0, 1, 2] and pool._all == [] and pool._idle == []
