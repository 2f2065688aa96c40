"""The execution engine (engine/): its place in the layers, and the keys and fingerprints of its ledger."""

import ast
from pathlib import Path

from opforge.engine.ledger import Ledger
from opforge.harness.batch import eval_fingerprint, result_key
from opforge.harness.evaluate import EvalConfig

ROOT = Path(__file__).resolve().parent.parent


def _imports(folder: str) -> dict[str, set[str]]:
    """Module file -> the opforge stages it imports (static and function-level imports alike)."""
    out = {}
    for path in sorted((ROOT / folder).glob("*.py")):
        stages = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            stages |= {n.split(".")[1] for n in names if n.startswith("opforge.") and n.count(".") >= 1}
        out[path.name] = stages
    return out


def test_engine_imports_no_stage_above_it_and_harness_no_filters_or_pipeline():
    for name, stages in _imports("engine").items():
        assert stages <= {"engine", "task"}, f"engine/{name} imports {sorted(stages - {'engine', 'task'})}"
    for name, stages in _imports("harness").items():
        assert not stages & {"filters", "pipeline", "compose", "seeds"}, f"harness/{name} imports {sorted(stages)}"
    for folder in ("filters", "pipeline"):
        for name, stages in _imports(folder).items():
            assert "harness" not in stages or (folder, name) == ("pipeline", "cli.py"), f"{folder}/{name}"


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
