"""The evaluation / RL environment (harness/) on CPU: a real C++ extension is compiled, verified, timed
and rewarded; every cheat of the suite in tests/harness_cases.py must get reward -1 with the right label.
GPU-only checks (side streams, CUDA events) are exercised on the lent GPU, not here."""

import json
import math
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.report import metrics, report
from opforge.harness.reward import reward_for
from opforge.harness.solution import Solution, SolutionError, extract_solution

from .harness_cases import (
    CHEATS,
    EXPECTED,
    EXPORT_KERNEL,
    HONEST,
    TASK,
    completion,
    model_new,
)

ROW = {"task_id": "scale_relu", "code": TASK, "data_source": "torch#2"}
FAST = EvalConfig(profile_compile=False, timing_trials=5, warmup=1)


@pytest.fixture(scope="session")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("extensions")


@pytest.fixture()
def dataset(tmp_path):
    path = tmp_path / "tasks.parquet"
    pd.DataFrame([ROW, {"task_id": "other", "code": TASK.replace("+ 1.0", "+ 2.0"), "data_source": "torch#3"}]
                 ).to_parquet(path)
    return path


def test_honest_cpp_solution_is_correct_timed_and_rewarded(build_root):
    res = evaluate(ROW, Solution(HONEST), EvalConfig(timing_trials=5), build_root=build_root)
    assert res.status == "correct" and res.correct and res.hacks == [], res
    assert res.max_error is not None and res.max_error <= 1.0
    assert res.build_s > 0 and not res.build_cached
    for ms in (res.eager_ms, res.compile_ms, res.candidate_ms):
        assert ms is not None and ms > 0
    assert math.isclose(res.speedup_eager, res.eager_ms / res.candidate_ms, rel_tol=1e-6)
    assert math.isclose(res.speedup_compile, res.compile_ms / res.candidate_ms, rel_tol=1e-6)
    assert res.reward == reward_for(res) >= 1.0
    assert res.precision["matmul_tf32"] is False and res.precision["float32_matmul_precision"] == "highest"
    again = evaluate(ROW, Solution(HONEST), FAST, build_root=build_root)
    assert again.build_cached and again.build_s == 0.0 and again.status == "correct"


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_every_cheat_gets_minus_one(name, build_root):
    res = evaluate(ROW, Solution(CHEATS[name]), FAST, build_root=build_root)
    want = EXPECTED[name]
    if want == "correct":  # the patch lands in the candidate's process, which times nothing
        assert res.status == "correct" and res.speedup_eager < FAST.max_speedup, res
        return
    assert res.reward == -1.0, res
    if want == "incorrect":
        assert res.status == "incorrect" and res.hacks == [], res
    else:
        assert res.status == "hacked" and any(h.startswith(want) for h in res.hacks), res


def test_build_error_and_missing_model_new(build_root):
    broken = {**HONEST, "kernels/fused.cpp": HONEST["kernels/fused.cpp"].replace("return y;", "return y")}
    res = evaluate(ROW, Solution(broken), FAST, build_root=build_root)
    assert res.status == "build_error" and res.reward == -1 and "error" in (res.error or "").lower()
    res = evaluate(ROW, Solution({"model_new.py": "import torch\n"}), FAST, build_root=build_root)
    assert res.status == "load_error" and "ModelNew" in res.error


def test_workspace_tools_and_protected_files(dataset, tmp_path, build_root, monkeypatch):
    from opforge.harness.workspace import init_workspace

    monkeypatch.setenv("OPFORGE_CACHE", str(build_root.parent))
    ws = init_workspace(dataset, "scale_relu", tmp_path / "ws")
    for f in ("model.py", "model_new.py", "RULES.md", "kernels/binding.cpp", "kernels/registry.h",
              "tools/compile.py", "tools/verify.py", "tools/profile.py"):
        assert (ws / f).is_file(), f
    assert (ws / "model.py").read_text() == TASK
    # the starting model_new.py is not a solution
    start = subprocess.run([sys.executable, "tools/verify.py"], cwd=ws, capture_output=True, text=True)
    assert start.returncode == 1 and "load_error" in start.stdout
    # the workspace style: OPFORGE_EXPORT + the fixed binding, checked by the workspace's own tool
    (ws / "kernels" / "fused.cpp").write_text(EXPORT_KERNEL)
    (ws / "model_new.py").write_text(HONEST["model_new.py"])
    done = subprocess.run([sys.executable, "tools/verify.py"], cwd=ws, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == "correct"
    # a candidate that edits a protected file while it is evaluated is caught even though its outputs are right
    edits = model_new(HONEST["model_new.py"].split("def forward(self, x):\n")[1],
                      head=f"import opforge_kernels\nimport pathlib\n_p = pathlib.Path({str(ws / 'model.py')!r})\n"
                           "_p.write_text(_p.read_text() + '\\n# edited\\n')\n")
    (ws / "model_new.py").write_text(edits)
    monkeypatch.chdir(ws)
    task = json.loads((ws / ".opforge" / "task.json").read_text())
    res = evaluate(task, Solution.from_dir(ws), FAST, workspace=ws, build_root=build_root)
    assert res.status == "hacked" and "protected_file:model.py" in res.hacks and res.reward == -1, res
    # an edit of the task between tool runs (the agent's shell) is caught against the record kept outside
    (ws / "model_new.py").write_text(HONEST["model_new.py"])
    (ws / ".opforge" / "task.json").write_text(json.dumps({**task, "code": TASK.replace("+ 1.0", "+ 0.0")}))
    (ws / "model.py").write_text(TASK.replace("+ 1.0", "+ 0.0"))
    res = evaluate(task, Solution.from_dir(ws), FAST, workspace=ws, build_root=build_root)
    assert res.status == "hacked" and res.reward == -1, res
    assert {"protected_file:model.py", "protected_file:.opforge/task.json"} <= set(res.hacks), res.hacks
    edited = subprocess.run([sys.executable, "tools/verify.py"], cwd=ws, capture_output=True, text=True)
    assert edited.returncode == 1 and json.loads(edited.stdout)["status"] == "hacked"


def test_opforge_eval_reports_the_metrics_of_its_results(dataset, tmp_path, build_root, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE", str(build_root.parent))
    sols = tmp_path / "solutions"
    Solution(HONEST).write_to(sols / "scale_relu")
    Solution(CHEATS["torch_relu"]).write_to(sols / "other")
    (sols / "unknown_task").mkdir()
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "eval", "--dataset", str(dataset),
                           "--solutions", str(sols), "--out", str(out), "--no-compile"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped unknown_task" in proc.stderr
    rep = json.loads((out / "report.json").read_text())
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in results) == ["other", "scale_relu"]
    assert rep["overall"] == json.loads(json.dumps(metrics(results)))
    assert rep["overall"]["pass_rate"] == 0.5 and rep["overall"]["hacked_rate"] == 0.5
    assert set(rep["by_data_source"]) == {"torch#2", "torch#3"}
    # a second run resumes: nothing is evaluated again (`harness eval` with positional inputs: the same command)
    proc = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "harness", "eval", str(dataset), str(sols),
                           str(out), "--no-compile", "--quiet"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and len((out / "results.jsonl").read_text().splitlines()) == 2
    # the fixed solution of "other" (no torch op any more, but scale_relu's +1.0 for a +2.0 task) is evaluated
    # again into the same --out and reported as it is now; the unchanged one is not
    shutil.rmtree(sols / "other")
    Solution(HONEST).write_to(sols / "other")
    proc = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "eval", "--dataset", str(dataset),
                           "--solutions", str(sols), "--out", str(out), "--no-compile"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    rep = json.loads((out / "report.json").read_text())
    assert rep["overall"]["status"] == {"correct": 1, "incorrect": 1}, rep["overall"]


def test_metrics_match_a_hand_computation():
    rows = [
        {"status": "correct", "reward": 3.0, "speedup_eager": 2.0, "speedup_compile": 1.5, "data_source": "a"},
        {"status": "correct", "reward": 1.0, "speedup_eager": 0.5, "speedup_compile": 0.25, "data_source": "a"},
        {"status": "correct", "reward": 2.0, "speedup_eager": 4.0, "speedup_compile": None, "data_source": "b"},
        {"status": "hacked", "reward": -1.0, "speedup_eager": 9.0, "speedup_compile": 9.0, "data_source": "b"},
        {"status": "incorrect", "reward": -1.0, "data_source": "b"},
    ]
    m = metrics(rows)
    assert m["n"] == 5 and m["pass_rate"] == 3 / 5
    assert m["faster_than_eager_rate"] == 2 / 5        # 2.0 and 4.0; the hacked 9.0 does not count
    assert m["faster_than_compile_rate"] == 1 / 5      # only 1.5 (None is not faster)
    assert math.isclose(m["geomean_speedup_eager"], (2.0 * 0.5 * 4.0) ** (1 / 3))
    assert math.isclose(m["geomean_speedup_compile"], (1.5 * 0.25) ** 0.5)
    assert math.isclose(m["mean_reward"], (3 + 1 + 2 - 1 - 1) / 5) and m["hacked_rate"] == 1 / 5
    by = report(rows)["by_data_source"]
    assert by["a"]["pass_rate"] == 1.0 and by["b"]["pass_rate"] == 1 / 3
    assert metrics([]) == {"n": 0, "status": {}}


def test_milestone_and_speedup_rewards():
    class R:
        def __init__(self, status, e=None, c=None):
            self.status, self.speedup_eager, self.speedup_compile = status, e, c

    assert reward_for(R("hacked", 9, 9)) == -1 and reward_for(R("incorrect")) == -1
    assert reward_for(R("correct", 1.05, 2.0)) == 1    # not more than 5 % faster than eager
    assert reward_for(R("correct", 1.06, 1.0)) == 2
    assert reward_for(R("correct", 1.06, 1.06)) == 3
    assert reward_for(R("correct", 1.5, 0.9), "speedup") == 1.5
    with pytest.raises(ValueError):
        reward_for(R("correct", 1, 1), "other")


def test_extract_solution_from_completions():
    sol = extract_solution(completion(HONEST))
    assert sol.files == HONEST
    alt = "text\n```python\n# file: model_new.py\nprint(1)\n```\n```cpp\n// file: kernels/a.cu\nint x;\n```"
    assert extract_solution(alt).files == {"model_new.py": "print(1)\n", "kernels/a.cu": "int x;\n"}
    with pytest.raises(SolutionError, match="no model_new.py"):
        extract_solution("no code here")
    with pytest.raises(SolutionError, match="leaves"):
        Solution({"model_new.py": "", "kernels/../../x.cpp": ""})
    assert Solution({"model_new.py": "", "model.py": "x", "tools/a.py": "y"}).ignored == ["model.py", "tools/a.py"]


def test_kernel_reward_scores_a_batch_of_completions(dataset, build_root, monkeypatch):
    from distributed import Client, LocalCluster
    from opforge.harness.rl import KernelReward

    monkeypatch.setenv("OPFORGE_CACHE", str(build_root.parent))
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    client = Client(cluster)
    try:
        fn = KernelReward(dataset, FAST, client=client, build_root=str(build_root))
        chat = [{"role": "user", "content": "..."}, {"role": "assistant", "content": completion(HONEST)}]
        rewards = fn(prompts=["p"] * 4, completions=[completion(HONEST), completion(CHEATS["functional"]),
                                                     "I cannot do this.", chat],
                     task_id=["scale_relu", "scale_relu", "scale_relu", "scale_relu"])
    finally:
        client.close()
        cluster.close()
    assert rewards[0] >= 1.0 and rewards[1] == -1.0 and rewards[2] == -1.0 and rewards[3] >= 1.0
    assert fn.__name__ == "opforge_kernel_reward" and len(fn.last_results) == 3
    with pytest.raises(ValueError, match="task_id"):
        fn(completions=["x"])
    _ = model_new  # the case builder is shared with the cheat suite


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["honest", "side_stream", "tf32", "torch_relu"])
def test_cuda_solution_and_gpu_only_cheats(name, build_root):
    from .harness_cases import CUDA_HONEST, CUDA_SIDE_STREAM, CUDA_TF32

    files = {"honest": CUDA_HONEST, "side_stream": CUDA_SIDE_STREAM, "tf32": CUDA_TF32,
             "torch_relu": CHEATS["torch_relu"]}[name]
    res = evaluate(ROW, Solution(files), EvalConfig(device="cuda", timing_trials=10), build_root=build_root)
    if name in ("honest", "side_stream"):  # work on any stream is waited for (device-wide sync) and timed
        assert res.status == "correct" and res.reward >= 1 and res.speedup_eager > 0, res
    else:
        want = {"tf32": "policy:attribute:torch.backends", "torch_relu": "torch_op:"}[name]
        assert res.reward == -1 and any(h.startswith(want) for h in res.hacks), res


def test_running_out_of_memory_is_its_own_status(build_root):
    """A candidate that runs out of memory gets status ``oom`` (reward -1), not ``incorrect``: on a shared
    GPU that may be the neighbours' fault, and ``harness.batch`` re-runs such evaluations alone."""
    from .harness_cases import model_new

    files = {"model_new.py": model_new("        raise MemoryError('simulated allocation failure')\n")}
    res = evaluate(ROW, Solution(files), EvalConfig(device="cpu", profile_compile=False), build_root=build_root)
    assert res.status == "oom" and res.reward == -1 and "simulated" in res.error, res
