"""The evaluation / RL environment (harness/) on CPU: a real C++ extension is compiled, verified, timed
and rewarded; every cheat of the suite in tests/harness_cases.py must get reward -1 with the right label.
GPU-only checks (side streams, CUDA events) are exercised on the lent GPU, not here."""

import json
import math
import os
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
        # prepare(): the worker's model servers' fork server listens before the first batch (the grader runs in
        # the worker on CPU: no grader fork server), in the environment the evaluations give their servers
        prepared = fn.prepare()
        from opforge.engine import forkserver
        from opforge.engine.oneshot import child_env, server_env
        from opforge.harness.grader import SERVER_ENV, SERVER_PRELOAD

        if forkserver.enabled():
            assert [(r["servers"], r["grader"]) for r in prepared.values()] == [(True, None)], prepared
            env = server_env(SERVER_ENV, base=child_env())
            sock = forkserver._folder() / f"{forkserver._key(SERVER_PRELOAD, env)}.sock"
            conn = forkserver._connect(sock)
            assert conn is not None
            conn.close()
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


def test_grader_in_its_own_process_gives_the_same_verdicts(build_root, monkeypatch):
    """The per-evaluation grader process (``harness.grader_child``, the CUDA default) decides like the grader in
    the calling process: an honest kernel is correct and timed, a wrong one incorrect, a hack hacked."""
    import opforge.harness.evaluate as ev

    monkeypatch.setitem(ev.GRADER_IN_CHILD, "cpu", True)
    honest = evaluate(ROW, Solution(HONEST), FAST, build_root=build_root)
    assert honest.status == "correct" and honest.reward >= 1.0, honest
    assert honest.logs.get("grader") and honest.candidate_ms > 0 and honest.eager_ms > 0
    wrong = evaluate(ROW, Solution({"model_new.py": model_new("        return torch.zeros_like(x) + 0.5\n")}), FAST,
                     build_root=build_root)
    assert wrong.reward == -1.0 and wrong.status in ("incorrect", "hacked"), wrong
    name = next(n for n in sorted(CHEATS) if EXPECTED[n] not in ("correct", "incorrect"))
    hacked = evaluate(ROW, Solution(CHEATS[name]), FAST, build_root=build_root)
    assert hacked.status == "hacked" and any(h.startswith(EXPECTED[name]) for h in hacked.hacks), hacked


@pytest.mark.parametrize(("warm", "forkserver"), [(False, True), (False, False), (True, True)],
                         ids=["per_evaluation", "per_evaluation_python_m", "warm"])
def test_a_grader_process_past_its_time_is_killed_with_its_servers(build_root, monkeypatch, tmp_path, warm,
                                                                     forkserver):
    """A grader process that overruns is killed, and so are its model servers, found from the process table
    or, when a fork server started them, killed by it (a paused candidate would otherwise wait for ever holding its
    GPU mappings; no file the candidate could write names them); the evaluation ends ``timeout``. The same for a long-lived grader process
    (``OPFORGE_WARM_GRADER=1``), whose next evaluation gets a new one."""
    import threading
    import time

    import opforge.harness.evaluate as ev
    import psutil
    from opforge.harness import grader_service

    monkeypatch.setitem(ev.GRADER_IN_CHILD, "cpu", True)
    if warm:
        monkeypatch.setenv("OPFORGE_WARM_GRADER", "1")
    if not forkserver:
        monkeypatch.setenv("OPFORGE_FORKSERVER", "0")
    stall = {"model_new.py": model_new("        import time\n        time.sleep(60)\n"
                                       "        return opforge_kernels.fused_scale_relu(x, self.scale)\n",
                                       head="import opforge_kernels\n"),
             **{k: v for k, v in HONEST.items() if k != "model_new.py"}}
    cfg = EvalConfig(profile_compile=False, timing_trials=5, warmup=1, eval_timeout_s=60.0)
    # the parent kills the grader at 15 s (25 s for a long-lived one, whose own start comes first)
    monkeypatch.setattr(ev, "GRADER_CHILD_MARGIN_S", -35.0 if warm else -45.0)
    work = tmp_path / "eval"
    seen: set[int] = set()
    done = threading.Event()

    # this test's model servers: started by python -m (cmdline) or forked by a fork server (engine.forkserver:
    # comm "opf-<role>", the fork server's environment, which is the servers' own, carries this test's tag)
    tag = f"{os.getpid()}-{tmp_path.name}"
    monkeypatch.setenv("OPFORGE_TEST_OVERRUN_TAG", tag)

    def servers() -> set[int]:
        out = set()
        for p in psutil.process_iter():
            try:
                cmd = p.cmdline()
                started = ("opforge.harness.server" in cmd and "opforge.engine.forkserver" not in cmd) or \
                    p.name() in ("opf-reference", "opf-candidate")
                if started and p.environ().get("OPFORGE_TEST_OVERRUN_TAG") == tag:
                    out.add(p.pid)
            except psutil.Error:
                continue
        return out

    def watch() -> None:
        while not done.is_set():
            seen.update(servers())
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        res = evaluate(ROW, Solution(stall), cfg, build_root=build_root, work_dir=work)
    finally:
        done.set()
        watcher.join()
    assert res.status == "timeout" and res.reward == -1.0, res
    assert len(seen) == 2, seen  # both servers were up when the grader was killed

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    for _ in range(100):
        if not any(alive(p) for p in seen):
            break
        time.sleep(0.1)
    assert not any(alive(p) for p in seen), [p for p in seen if alive(p)]
    assert res.logs.get("grader")
    if warm:
        assert all(s.server is None for s in grader_service.POOL.all)  # the killed grader is not lent again
        honest = evaluate(ROW, Solution(HONEST), FAST, build_root=build_root)
        assert honest.status == "correct", honest
        grader_service.POOL.close()


def test_an_evaluation_reserves_what_its_three_processes_hold():
    """``harness.gpu_memory.evaluation_bytes`` over real layouts: slots of both servers for every set of every
    shape, the waiting draws, the output copies, the reference's and the candidate's peaks, the contexts."""
    from opforge.engine.memory_estimate import predict_footprint
    from opforge.harness.gpu_memory import (
        CONTEXT_BYTES,
        FLUSH_BYTES,
        MARGIN,
        REFERENCE_FACTOR,
        Shape,
        evaluation_bytes,
        layout_bytes,
    )

    fp = predict_footprint(TASK, "cpu")
    assert fp is not None and fp.inputs > 0 and fp.outputs > 0 and fp.peak >= fp.inputs + fp.outputs
    lay = [{"tensor": True, "shape": [16, 64], "dtype": "float32"}, {"tensor": False, "value": 3},
           {"tensor": True, "shape": [8], "dtype": "bfloat16"}]
    assert layout_bytes(lay) == 16 * 64 * 4 + 8 * 2
    pub, var = Shape(4, fp.inputs, fp.outputs, fp.peak), Shape(2, 4 * fp.inputs, 4 * fp.outputs, 3 * fp.peak)
    grader = (2 * 4 * (fp.inputs + fp.outputs) + 4 * fp.inputs + 2 * 2 * 4 * (fp.inputs + fp.outputs)
              + 2 * 4 * fp.inputs + 2 * 4 * fp.outputs + FLUSH_BYTES)
    reference = REFERENCE_FACTOR * 3 * fp.peak + max(4 * fp.inputs, 2 * 4 * fp.inputs)
    want = int(MARGIN * (grader + reference + 3 * fp.peak)) + 2 * CONTEXT_BYTES
    assert evaluation_bytes([pub, var]) == want
    assert evaluation_bytes([pub, var]) > evaluation_bytes([pub]) > evaluation_bytes([Shape(2, *pub[1:])])
    with pytest.raises(ValueError):
        evaluation_bytes([])


def test_the_reference_predicts_the_need_of_every_shape_it_will_run():
    """``reference_process.predicted_need_gib``: the public shape with ``input_sets`` sets (two with CUDA graphs and
    one call per burst) and each hidden variant with two, from fake-tensor runs (inputs and outputs scale with the
    variant's batch); a variant the task cannot take is left out; a task fake tensors cannot run gives None (the caller admits ``gpu_admit_gib``)."""
    from opforge.engine.memory_estimate import predict_footprint
    from opforge.harness.gpu_memory import Shape, evaluation_bytes
    from opforge.harness.reference_process import predicted_need_gib
    from opforge.task.sizes import with_sizes

    sized = TASK.replace("    return [torch.randn(64, 256)]", "    return [torch.randn(batch_size, 256)]").replace(
        "def get_inputs():", "batch_size = 64\n\n\ndef get_inputs():")
    msg = {"task_code": sized, "task_id": "t", "input_sets": 4, "variants": [{"batch_size": 256}, {"no_such": 3}]}
    pub, var = predict_footprint(sized, "cpu"), predict_footprint(with_sizes(sized, {"batch_size": 256}), "cpu")
    assert pub.inputs == 64 * 256 * 4 and var.inputs == 256 * 256 * 4 and var.outputs == 4 * pub.outputs
    want = evaluation_bytes([Shape(4, pub.inputs, pub.outputs, pub.peak), Shape(2, var.inputs, var.outputs, var.peak)])
    assert predicted_need_gib(msg, "cpu") == want / 2**30
    # with CUDA graphs the rounds rotate over two captured sets of one call each: two are allocated, not four
    graphed = evaluation_bytes([Shape(2, pub.inputs, pub.outputs, pub.peak), Shape(2, var.inputs, var.outputs, var.peak)])
    assert predicted_need_gib({**msg, "cuda_graphs": True}, "cpu") == graphed / 2**30 < want / 2**30
    assert predicted_need_gib({**msg, "variants": []}, "cpu") < want / 2**30
    assert predicted_need_gib({**msg, "task_code": sized.replace("return torch.relu(", "return x.sum().item() * (")},
                              "cpu") is None


def test_a_reference_out_of_memory_is_oom_and_a_broken_task_load_error(build_root):
    """A task whose reference runs out of memory ends ``oom`` (re-run alone by ``harness.batch``: on a shared GPU
    the neighbours may have caused it), while a task that fails otherwise is ``load_error``."""
    oom_row = {**ROW, "task_id": "oom_task",
               "code": TASK.replace("return torch.relu(x * self.scale + 1.0)", "raise MemoryError('simulated')")}
    res = evaluate(oom_row, Solution(HONEST), FAST, build_root=build_root)
    assert res.status == "oom" and res.reward == -1.0 and "simulated" in res.error, res
    broken_row = {**oom_row, "task_id": "broken_task", "code": oom_row["code"].replace("MemoryError", "ValueError")}
    res = evaluate(broken_row, Solution(HONEST), FAST, build_root=build_root)
    assert res.status == "load_error" and res.reward == -1.0, res


def test_the_reference_draws_into_the_graders_slots_or_not_at_all():
    """Drawn inputs land in the grader's slots (shared files on CPU) only when every tensor matches its slot
    in shape and dtype; a mismatch copies nothing (no broadcasting into a larger slot)."""
    import torch
    from opforge.harness.reference_process import _into_slots
    from opforge.harness.server import Server
    from opforge.harness.slots import SlotSet, map_slots

    grader = SlotSet("cpu")
    try:
        a, _ = grader.new([4, 3], torch.float32)
        b, _ = grader.new([5], torch.int64)
        c, _ = grader.new([4, 3], torch.float32)
        server = Server("cpu")
        server.slots = map_slots([s.as_dict() for s in grader.specs], None)
        first = [torch.randn(4, 3), 7, torch.arange(5)]
        second = [torch.randn(4, 3)]
        assert _into_slots(server, [first, second], [[a, b], [c]]) is True
        assert torch.equal(grader.tensors[a], first[0]) and torch.equal(grader.tensors[b], first[2])
        assert torch.equal(grader.tensors[c], second[0])
        before = [t.clone() for t in grader.tensors]
        for bad in ([torch.randn(1, 3), 7, torch.arange(5)],          # broadcastable, wrong shape
                    [torch.randn(4, 3).double(), 7, torch.arange(5)],  # wrong dtype
                    [torch.randn(4, 3), 7]):                           # a tensor missing
            assert _into_slots(server, [second, bad], [[c], [a, b]]) is False
            assert all(torch.equal(x, y) for x, y in zip(grader.tensors, before, strict=True))
        assert _into_slots(server, [first], [[a, b], [c]]) is False  # sets and targets differ in number
    finally:
        grader.close()


def test_the_compiler_warm_up_runs_once_per_process_and_a_failing_step_is_left_to_the_compile():
    """``reference_process.warm_compiler`` starts one thread per process (a second call returns it), its steps run
    (Inductor's modules imported), ``compiler_warm`` joins it; a step that raises
    (Triton absent here, or an API another torch lacks) ends the warm-up quietly, and torch.compile still works
    after it. In a fresh interpreter, so the test process's modules do not decide what is imported."""
    script = """
import sys
import torch
from opforge.harness import reference_process as rp
assert "torch._inductor.compile_fx" not in sys.modules
t = rp.warm_compiler()
assert rp.warm_compiler() is t
rp.compiler_warm()
assert not t.is_alive() and "torch._inductor.compile_fx" in sys.modules
rp._WARMING.clear()
def broken():
    raise RuntimeError("no such API")
rp._compiler_start = broken
rp.warm_compiler()
rp.compiler_warm()
rp.compiler_warm()
print("after", float(torch.compile(lambda x: x * 2 + 1)(torch.ones(3)).sum()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception in thread" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip().endswith("after 9.0"), done.stdout


def test_the_references_first_call_and_size_step_wait_for_its_compiler_warm_up():
    """A reference server set up while its compiler warm-up still runs: its ``before_call`` (run before every
    ``call``) and its ``size`` step both block until the warm-up ends; after the first call ``before_call`` is the
    default one again. The warm-up is held by an event, so nothing here depends on how long a real one takes."""
    script = """
import threading, time
from opforge.harness import reference_process as rp
from opforge.harness.server import noop
release, started = threading.Event(), threading.Event()
def held():
    started.set()
    release.wait(60)
rp._compiler_start = held
rp.warm_compiler()
started.wait(60)
code = "import torch\\nimport torch.nn as nn\\n\\n\\nclass Model(nn.Module):\\n    def forward(self, x):\\n        return x * 2\\n\\n\\ndef get_inputs():\\n    return [torch.randn(8)]\\n\\n\\ndef get_init_inputs():\\n    return []\\n"
msg = {"op": "setup", "task_code": code, "task_id": "t", "seed": 3, "device": "cpu", "threads": 1,
       "allow_tf32": False, "variants": [], "input_sets": 2, "burst_target_ms": 0.0, "burst_calls": None,
       "gpu_memory_fraction": 0.9, "gpu_admit_gib": 4.0}
server, reply, _ = rp.setup(msg, None)
assert reply["ok"]
done = {}
waiters = [threading.Thread(target=lambda: (server.before_call(), done.setdefault("call", time.monotonic()))),
           threading.Thread(target=lambda: (server.handlers["size"]({}, None), done.setdefault("size", time.monotonic())))]
for w in waiters:
    w.start()
time.sleep(1.0)
assert not done, done
released = time.monotonic()
release.set()
for w in waiters:
    w.join(60)
assert set(done) == {"call", "size"} and min(done.values()) >= released, done
assert server.before_call is noop
print("waited")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception in thread" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip().endswith("waited"), done.stdout


def test_a_burst_asked_for_cuda_graphs_on_cpu_runs_plainly_and_says_so():
    """``serve_call`` with ``graph`` on a CPU server: every call runs (outputs copied into their slots, inputs
    untouched), nothing is captured, and the reply says the burst was not a replay, twice in a row."""
    import torch
    from opforge.harness.server import Server, serve_call

    server = Server("cpu")
    server.targets["t"] = lambda x: x * 2 + 1
    xs = [torch.randn(3, 4) for _ in range(2)]
    server.slots = [*xs, torch.full((3, 4), float("nan")), torch.full((3, 4), float("nan"))]
    msg = {"target": "t", "graph": True,
           "calls": [{"inputs": [{"slot": 0}], "outputs": [2]}, {"inputs": [{"slot": 1}], "outputs": [3]}]}
    for _ in range(2):
        reply = serve_call(server, msg)
        assert reply["ok"] is True and reply["graphed"] is False and "graph_error" not in reply, reply
        assert [c["copied"] for c in reply["calls"]] == [True, True] and reply["hint_ms"] >= 0
        assert torch.equal(server.slots[2], xs[0] * 2 + 1) and torch.equal(server.slots[3], xs[1] * 2 + 1)
        server.slots[2].fill_(float("nan"))
    assert server.graphs == {} and server.graph_error == {}
