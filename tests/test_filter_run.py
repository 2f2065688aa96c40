"""Sandboxed, Dask-distributed ``opforge filter`` runs: fault tolerance, resume, input errors, CLI."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from opforge.engine.ledger import Ledger
from opforge.engine.sandbox import Sandbox
from opforge.filters.chain import CHAIN_JOB, FilterSettings
from opforge.pipeline.filter_run import InputError, read_tasks, run_filter

from .filter_tasks import GOOD, task

HANG = task("        import time\n        time.sleep(600)\n        return x")
ABORT = task("        import os\n        os.abort()")
TERABYTE = task("        return torch.ones(2**40, 1024, dtype=torch.uint8)")
# slow to build (get_init_inputs sleeps), fast to run: a run of these is long enough to be killed
SLOW = [task(f"        return self.lin(x) + {i}.0", init_inputs="(__import__('time').sleep(1.0), [32])[1]")
        for i in range(8)]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sandbox_survives_hang_abort_and_terabyte_allocation():
    settings = FilterSettings(skip=["compile", "contamination"], memory_gib=4).model_dump()
    with Sandbox(CHAIN_JOB, settings) as box:
        first_pid = box.proc.pid
        # the start-up objects (torch and the filters: >100k) are out of the collector's reach
        assert box.child_info["gc_frozen"] > 100_000, box.child_info
        outcomes = {name: box.run(name, code, timeout_s=10) for name, code in
                    [("good1", GOOD), ("hang", HANG), ("good2", GOOD), ("abort", ABORT), ("tera", TERABYTE),
                     ("good3", GOOD)]}
        assert box.starts == 3  # the first child, then one after the hang and one after the abort
        assert box.proc.pid != first_pid
    # the roofline filter is the first to run forward (on meta): the hang is met there
    assert outcomes["hang"]["reason"] == "timeout" and outcomes["hang"]["filter"] == "roofline"
    assert outcomes["abort"]["reason"] == "crash:SIGABRT"
    assert outcomes["tera"]["reason"] == "oom"
    for name in ("good1", "good2", "good3"):
        assert outcomes[name]["accepted"], outcomes[name]


def test_a_child_that_cannot_start_is_tried_again_then_reported(tmp_path, monkeypatch):
    import torch
    from opforge.engine.sandbox import SandboxError

    if torch.cuda.is_available():
        pytest.skip("needs a machine where a CUDA child cannot start")
    monkeypatch.setattr(Sandbox, "START_RETRY_S", (0.01,))
    log = tmp_path / "child.log"
    box = Sandbox(CHAIN_JOB, FilterSettings(device="cuda").model_dump(), log_path=log)
    with pytest.raises(SandboxError, match=r"did not start.*\(2 tries\)"):
        box.start()
    assert log.read_text().count("RuntimeError: device 'cuda' asked for") == 2  # two children, both failed
    assert box.starts == 0 and box.start_seconds > 0


def test_memory_watchdog_kills_a_child_over_its_resident_limit():
    # CUDA children have no address-space cap; the parent's resident-size watchdog must stop this one
    code = task("        import time\n        big = torch.ones(1200 * 2**20, dtype=torch.uint8)\n"
                "        time.sleep(60)\n        return x + big[0]")
    # roofline left out: it would run the sleeping forward on meta first
    settings = FilterSettings(skip=["compile", "contamination", "roofline"], memory_gib=0.5,
                              address_space_cap=False).model_dump()
    with Sandbox(CHAIN_JOB, settings) as box:
        assert "address_space_limit" not in box.child_info
        t0 = time.monotonic()
        res = box.run("big", code, timeout_s=50)
        assert time.monotonic() - t0 < 40
        assert res["reason"] == "oom" and res["filter"] == "eager", res
        assert box.run("good", GOOD, timeout_s=30)["accepted"]


def test_filter_run_gives_every_task_its_own_verdict(tmp_path):
    rows = [{"code": GOOD, "task_id": "good"}, {"code": HANG, "task_id": "hang"},
            {"code": ABORT, "task_id": "abort"}, {"code": TERABYTE, "task_id": "tera"},
            {"code": GOOD.replace("* 2.0", "* 3.0")}, {"code": 42, "task_id": "not-code"},
            {"code": GOOD, "task_id": "good"}]
    src = _write_jsonl(tmp_path / "tasks.jsonl", rows)
    # duplicate / contamination are tested in test_contamination.py; here rows 0 and 6 share a verdict
    settings = FilterSettings(skip=["compile", "duplicate", "contamination"], timeout_s=15, memory_gib=4)
    res = run_filter(src, tmp_path / "run", settings, workers=2, progress=False)
    v = res.verdicts.set_index("row")
    assert len(v) == len(rows)
    assert v.loc[1, "reason"] == "timeout" and v.loc[2, "reason"] == "crash:SIGABRT"
    assert v.loc[3, "reason"] == "oom" and v.loc[5, "reason"] == "invalid_task"
    assert v.loc[0, "accepted"] and v.loc[4, "accepted"] and v.loc[6, "accepted"]
    assert v.loc[4, "task_id"] != "good" and len(v.loc[4, "task_id"]) == 16  # computed content hash
    f = res.funnel
    assert f["input_rows"] == 7 and f["unique_tasks"] == 6 and f["accepted_tasks"] == 2
    assert f["by_reason"] == {"timeout": 1, "crash": 1, "oom": 1, "invalid_task": 1}
    assert json.loads((tmp_path / "run" / "funnel.json").read_text())["unique_tasks"] == 6
    assert len(pd.read_parquet(tmp_path / "run" / "verdicts.parquet")) == 7
    # a second run resumes everything from the ledger and runs nothing
    again = run_filter(src, tmp_path / "run", settings, workers=2, progress=False)
    assert again.funnel["ran_this_time"] == 0 and again.funnel["resumed_from_ledger"] == 6
    assert again.verdicts["reason"].fillna("").tolist() == res.verdicts["reason"].fillna("").tolist()


def test_killed_filter_command_resumes_and_verdicts_each_task_once(tmp_path):
    src = _write_jsonl(tmp_path / "slow.jsonl", [{"code": c, "task_id": f"slow{i}"} for i, c in enumerate(SLOW)])
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "opforge.pipeline.cli", "filter", str(src), "--out", str(run_dir),
           "--only", "eager", "--workers", "1", "--timeout-s", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ledger = run_dir / "ledger.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(ledger.read_text().splitlines())
    assert 2 <= done_before < len(SLOW)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ids = [json.loads(line)["task_id"] for line in ledger.read_text().splitlines()]
    assert sorted(ids) == sorted(f"slow{i}" for i in range(len(SLOW)))  # every task exactly once
    funnel = json.loads((run_dir / "funnel.json").read_text())
    assert funnel["resumed_from_ledger"] == done_before and funnel["accepted_tasks"] == len(SLOW)


def test_ledger_ignores_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path, "fp")
    led.append({"task_id": "a", "accepted": True, "reason": None, "filter": None, "metrics": {"x": float("inf")}})
    led.close()
    with open(path, "a") as fh:
        fh.write('{"task_id": "b", "accep')
    again = Ledger(path, "fp")
    assert list(again.done) == ["a"] and again.truncated_lines == 1
    assert again.done["a"]["metrics"]["x"] == "inf"
    again.append({"task_id": "c", "accepted": False, "reason": "oom", "filter": "eager", "metrics": {}})
    again.close()
    assert list(Ledger(path, "fp").done) == ["a", "c"]
    assert Ledger(path, "other-fingerprint").done == {}


def test_verdict_table_rows_kept_between_calls_equal_the_table_built_afresh(tmp_path):
    """A stream keeps the table fields of ledger records between rounds: the table is the one built afresh;
    a corpus record takes its row's place, a task without a verdict has no row."""
    import pandas as pd
    from opforge.pipeline.filter_run import _verdict_table

    led = Ledger(tmp_path / "ledger.jsonl", "fp")
    led.append({"task_id": "a", "accepted": True, "reason": None, "filter": None, "worker": "w0",
                "metrics": {"runtime": {"eager_ms": 1.5}}, "seconds": {"eager": 0.2, "compile": 0.5}})
    led.append({"task_id": "b", "accepted": False, "reason": "non_finite", "filter": "eager", "worker": "w1",
                "metrics": {}, "seconds": {"eager": 0.1}})
    tasks = pd.DataFrame({"row": [0, 1, 2, 3], "task_id": ["a", "b", "a", "c"]})
    corpus = {2: {"accepted": False, "reason": "duplicate:exact", "filter": "duplicate", "worker": "client",
                  "metrics": {"duplicate": {"duplicate_of": 0}}, "seconds": {"duplicate": 0.001}}}
    kept: dict = {}
    first, again = _verdict_table(tasks, led, corpus, kept), _verdict_table(tasks, led, corpus, kept)
    fresh = _verdict_table(tasks, led, corpus)
    assert set(kept) == {"a", "b"}
    pd.testing.assert_frame_equal(first, fresh)
    pd.testing.assert_frame_equal(again, fresh)
    assert list(fresh["row"]) == [0, 1, 2] and list(fresh["reason"])[1:] == ["non_finite", "duplicate:exact"]
    assert pd.isna(fresh.loc[0, "reason"]) and list(fresh["accepted"]) == [True, False, False]
    assert fresh.loc[0, "eager_ms"] == 1.5 and fresh.loc[0, "seconds"] == 0.7
    led.close()


@pytest.mark.parametrize(("content", "suffix", "message"), [
    ('{"code": "x"}\nnot json\n', ".jsonl", r"tasks.jsonl:2: not a JSON object"),
    ('{"source": "x"}\n', ".jsonl", "no 'code' column"),
    ("a,b\n", ".csv", "expected .jsonl"),
])
def test_bad_input_names_file_and_line(tmp_path, content, suffix, message):
    path = tmp_path / f"tasks{suffix}"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_tasks(path)


def test_missing_input_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_tasks(tmp_path / "nope.parquet")


def test_cli_reports_bad_filter_name(tmp_path):
    src = _write_jsonl(tmp_path / "t.jsonl", [{"code": GOOD}])
    out = subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "filter", str(src), "--out",
                          str(tmp_path / "r"), "--skip", "compil"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown filter 'compil'" in out.stderr


_CALLS: list[tuple[str, bool, float | None]] = []  # (task_id, alone, reserve_gib) in call order


def _fake_verdict(task_id, code, alone=False, reserve_gib=None):
    """Stand-in for ``filter_run.verdict_task``, as a GPU sandbox answers: tasks named big* run out of
    memory unless alone (first with ``retry_gib``, then with ``retry_alone``); mid* fit once 8 GiB are
    reserved for them."""
    _CALLS.append((task_id, alone, reserve_gib))  # list.append is atomic under the GIL
    time.sleep(0.05)
    oom = {"task_id": task_id, "accepted": False, "reason": "oom", "filter": "eager", "metrics": {},
           "seconds": {}, "worker": "w", "start_s": 0.0}
    if task_id.startswith(("big", "mid")) and not alone and not (task_id.startswith("mid") and reserve_gib):
        return {**oom, "retry_alone": True} if reserve_gib else {**oom, "retry_gib": 8.0}
    extra = {"retried_alone": True} if alone else {}
    return {"task_id": task_id, "accepted": True, "reason": None, "filter": None, "metrics": {},
            "seconds": {}, "worker": "w", "start_s": 0.0, **extra}


def test_failed_allocation_size_is_read_from_the_oom_message():
    from opforge.engine.sandbox_child import _failed_allocation_gib

    msg = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 139.8 GiB"
    assert _failed_allocation_gib(msg) == 2.5
    assert _failed_allocation_gib("Tried to allocate 512.00 MiB.") == 0.5
    assert _failed_allocation_gib("MemoryError: simulated") == 0.0


def test_oom_next_to_others_is_rerun_reserved_then_alone(tmp_path, monkeypatch):
    """A GPU sandbox answers an ``oom`` it got next to other tasks with ``retry_gib``: the dispatcher does
    not ledger it and submits it again at once reserving that much; an ``oom`` of that re-run
    (``retry_alone``) is run once more with ``alone=True`` after every other task, and ledgered then.
    The sandbox is stubbed (the answers themselves need a GPU); the dispatch is the real one, on an
    in-process Dask cluster with 2 threads."""
    from distributed import Client, LocalCluster
    from opforge.engine.cluster import ClusterHandle
    from opforge.pipeline import filter_run

    _CALLS.clear()
    monkeypatch.setattr(filter_run, "verdict_task", _fake_verdict)
    rows = [{"code": GOOD, "task_id": f"{'big' if i in (1, 4) else 'mid' if i == 2 else 'ok'}{i}"}
            for i in range(10)]
    src = _write_jsonl(tmp_path / "tasks.jsonl", rows)
    settings = FilterSettings(only=["static"], timeout_s=15)
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    handle = ClusterHandle(Client(cluster), cluster, "threads", 2)
    try:
        res = run_filter(src, tmp_path / "run", settings, progress=False, handle=handle)
    finally:
        handle.close()
    calls = list(_CALLS)
    alone = [i for i, (_, a, _) in enumerate(calls) if a]
    assert sorted(calls[i][0] for i in alone) == ["big1", "big4"]
    reserved = {t: i for i, (t, a, g) in enumerate(calls) if g == 8.0 and not a}
    assert sorted(reserved) == ["big1", "big4", "mid2"]
    assert reserved["mid2"] < len(calls) - 3  # re-run at once, before the last tasks, not at the end
    assert min(alone) == len(rows) + 3  # the alone re-runs come after all first runs and reserved re-runs
    ledger = Ledger(tmp_path / "run" / "ledger.jsonl", res.funnel["fingerprint"])
    assert sorted(ledger.done) == sorted(r["task_id"] for r in rows)  # each task ledgered once
    assert ledger.done["big1"]["retried_alone"] and "retry_alone" not in ledger.done["big4"]
    ledger.close()
    assert res.funnel["oom_rerun_alone"] == 2 and res.funnel["accepted_tasks"] == 10


def test_one_gpu_step_longer_than_the_step_limit_ends_the_task(tmp_path, monkeypatch):
    """A forward that holds the GPU lock for 4 s (every neighbour that wants to time would wait for it)
    ends the task with ``timeout`` once it outlasts ``gpu_step_limit_s`` (1 s), long before the task's
    own 60 s timeout; with no step limit the same task is accepted. Plain lock files: no GPU needed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = task("        import time\n        from opforge.engine.gpu_locks import GpuLock\n"
                "        with GpuLock('steptest', 'compute').shared():\n            time.sleep(4.0)\n"
                "        return x * 2.0")
    for limit in (1.0, 0.0):
        settings = FilterSettings(only=["eager"], timeout_s=60.0, gpu_step_limit_s=limit).model_dump()
        with Sandbox(CHAIN_JOB, settings, env={"TMPDIR": str(tmp_path)}) as box:
            t0 = time.monotonic()
            result = box.run("s", code, timeout_s=60.0)
            seconds = time.monotonic() - t0
        if limit:
            assert result["reason"] == "timeout:gpu_step" and seconds < 3.5, (result, seconds)
            assert result["metrics"]["eager"]["gpu_step_s"] > 1.0
        else:
            assert result["accepted"] and seconds >= 4.0, result


def test_a_forward_with_more_gpu_time_than_the_share_limit_ends_the_task(tmp_path, monkeypatch):
    """A "forward" step held for 3 s alone has had 3 s of the GPU: it ends as ``timeout`` once past
    ``gpu_share_limit_s`` (1 s), long before the step limit (10 s). Next to three other shared holders the
    same 3 s step had at most 3 / 4 s, and the task is accepted; so is a task's first forward call held
    alone (it carries one-time costs: only the step limit applies to it). Plain lock files: no GPU needed."""
    import tempfile

    from opforge.engine.gpu_locks import GpuLock, shared_holders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def code(kind):
        return task("        import time\n        from opforge.engine.gpu_locks import GpuLock\n"
                    f"        with GpuLock('sharetest', 'compute').shared({kind!r}):\n            time.sleep(3.0)\n"
                    "        return x * 2.0")

    settings = FilterSettings(only=["eager"], timeout_s=60.0, gpu_step_limit_s=10.0,
                              gpu_share_limit_s=1.0).model_dump()
    neighbours = [GpuLock("sharetest", "compute") for _ in range(3)]
    with Sandbox(CHAIN_JOB, settings, env={"TMPDIR": str(tmp_path)}) as box:
        alone = box.run("alone", code("forward"), timeout_s=60.0)
        with neighbours[0].shared(), neighbours[1].shared(), neighbours[2].shared():
            assert shared_holders(neighbours[0].paths[0]) == 3
            shared = box.run("shared", code("forward"), timeout_s=60.0)
        first = box.run("first", code("first_forward"), timeout_s=60.0)
    assert shared_holders(neighbours[0].paths[0]) == 0
    m = alone["metrics"]["eager"]
    assert alone["reason"] == "timeout:gpu_share" and m["gpu_share_s"] > 1.0 and m["gpu_step_s"] < 2.5, alone
    assert shared["accepted"] and 0.7 <= shared["gpu_share_max_s"] < 1.0, shared
    # the parent times a step from the child's messages as it reads them, so a 3 s hold can read a few ms
    # short (2.996 s on a loaded CI machine): what matters is that it ran far past the 1 s share limit
    assert first["accepted"] and first["gpu_step_max_s"] > 2.5 and "gpu_share_max_s" not in first


def test_the_share_limit_stands_aside_when_the_locks_do_not_show_the_hold(tmp_path):
    """When ``/proc/locks`` shows no shared holder of the step's lock file (so not even the child's own
    hold can be seen), the GPU-time bound is not computed and only the step limit applies."""
    from opforge.engine.sandbox import GpuStepWatch

    unheld = tmp_path / "opforge-gpu-x.compute"
    unheld.write_text("")
    watch = GpuStepWatch(step_limit=0.0, share_limit=0.1)
    watch.start({"mode": "shared", "kind": "forward", "path": str(unheld)}, now=0.0)
    assert not watch.watching_share() and watch.over(now=30.0) is None
    watch = GpuStepWatch(step_limit=1.0, share_limit=0.1)
    watch.start({"mode": "shared", "kind": "forward", "path": str(unheld)}, now=0.0)
    assert watch.over(now=1.5) == {"gpu_step_s": 1.5, "gpu_step_limit_s": 1.0}


def test_time_waiting_for_a_gpu_lock_does_not_count_against_the_timeout(tmp_path, monkeypatch):
    """A task waiting 3 s for a GPU lock held by a neighbour finishes under a 2 s timeout: the child
    reports the wait and the parent extends the deadline by it (plain lock files: no GPU needed)."""
    import tempfile
    import threading

    from opforge.engine.gpu_locks import GpuLock

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = task("        from opforge.engine.gpu_locks import GpuLock\n"
                "        with GpuLock('waittest', 'compute').shared():\n            pass\n        return x * 2.0")
    settings = FilterSettings(only=["eager"], timeout_s=2.0).model_dump()

    def run_behind_a_neighbour(max_lock_wait_s: float) -> tuple[dict, float]:
        with Sandbox(CHAIN_JOB, settings, env={"TMPDIR": str(tmp_path)}, max_lock_wait_s=max_lock_wait_s) as box:
            holder = GpuLock("waittest", "compute")
            result: dict = {}
            with holder.exclusive():
                started = time.monotonic()
                runner = threading.Thread(target=lambda: result.update(box.run("w", code, timeout_s=2.0)))
                runner.start()
                time.sleep(3.0)  # the task waits for this neighbour's hold
            runner.join(timeout=60)
            holder.close()
        return result, time.monotonic() - started

    result, seconds = run_behind_a_neighbour(600.0)
    assert result.get("accepted") and seconds >= 3.0, result
    result, _ = run_behind_a_neighbour(0.0)  # no credit for waiting: the same task times out
    assert result["reason"] == "timeout", result


def test_default_workers_follow_the_usable_cores_per_gpu(monkeypatch):
    """CPU: one worker per core this process may use (``taskset`` shrinks it); CUDA: that share per GPU
    less the cores kept for the client and Dask, never below one sandbox nor above the per-GPU cap."""
    import os

    from opforge.engine import cluster

    for cores, gpus, cpu, cuda in [(16, 1, 16, 14), (32, 2, 32, 14), (64, 4, 64, 14), (2, 1, 2, 1), (8, 3, 8, 1),
                                   (64, 1, 64, cluster.MAX_SANDBOXES_PER_GPU), (32, 1, 32, 30)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert cluster.default_workers("cpu") == cpu
        assert cluster.default_workers("cuda", gpus) == cuda, (cores, gpus)


def test_cli_threshold_overrides_reach_the_filters_and_bad_ones_are_named(tmp_path):
    """``--threshold runtime.window_ms=[1000,2000]`` gives the CPU run a window, which rejects a fast task
    that the default (no window on CPU) accepts; a misspelt key, an unknown filter or a malformed text ends
    the command before any work, naming it."""
    src = _write_jsonl(tmp_path / "t.jsonl", [{"code": GOOD, "task_id": "good"}])

    def cli(out: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "filter", str(src), "--out",
                               str(tmp_path / out), "--only", "eager,runtime", "--workers", "1", *extra],
                              capture_output=True, text=True, timeout=300)

    default, windowed = cli("default"), cli("windowed", "--threshold", "runtime.window_ms=[1000, 2000]")
    assert default.returncode == 0 and windowed.returncode == 0, windowed.stderr[-2000:]
    verdicts = {name: pd.read_parquet(tmp_path / name / "verdicts.parquet").iloc[0] for name in ("default", "windowed")}
    assert verdicts["default"]["accepted"]
    assert verdicts["windowed"]["reason"] == "runtime_out_of_window:too_fast"
    for extra, message in [("runtime.budgt_s=0.01", "has no threshold(s) ['budgt_s']"),
                           ("runtim.budget_s=0.01", "unknown filter 'runtim'"),
                           ("runtime.budget_s", "expected FILTER.KEY=VALUE")]:
        bad = cli("bad", "--threshold", extra)
        assert bad.returncode == 2 and message in bad.stderr, (extra, bad.stderr[-500:])
    assert not (tmp_path / "bad").exists()
