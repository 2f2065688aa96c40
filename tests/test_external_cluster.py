"""``opforge filter`` and ``opforge eval`` on an external Dask cluster started with the standard CLI
(``dask scheduler``, two ``dask worker`` processes), each worker in its own working and local directory
with its own cache: nothing reaches the workers through the client's run directory. One worker is killed
while the filter runs: every task still gets exactly one verdict, and re-runs resume."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.solution import Solution

from .filter_tasks import task

pytestmark = pytest.mark.slow

# forward sleeps 0.3 s: a task's eager check takes a few seconds, so the run is still going when a worker dies
SLOW = [task(f"        __import__('time').sleep(0.3)\n        return self.lin(x) + {i}.0") for i in range(8)]
TASK = "scale_relu"
TASK_CODE = task("        return torch.relu(self.lin(x)) * 2.0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    log = open(cwd / "process.log", "wb")  # noqa: SIM115 - the process keeps it
    return subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "opforge.pipeline.cli", *args]


@pytest.fixture()
def cluster(tmp_path):
    """(scheduler address, {name: (worker process, its directory)}) of a fresh localhost cluster."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "dask"]
    procs = [_start([*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                    tmp_path / "scheduler")]
    workers = {}
    try:
        for name in ("wa", "wb"):
            home = tmp_path / name
            proc = _start([*dask, "worker", address, "--name", name, "--nthreads", "1", "--memory-limit", "0",
                           "--no-dashboard", "--local-directory", str(home / "local")], home,
                          env={"OPFORGE_CACHE": str(home / "cache")})
            procs.append(proc)
            workers[name] = (proc, home)
        from distributed import Client

        with Client(address, timeout="120s") as client:
            client.wait_for_workers(2, timeout=180)
        yield address, workers
    finally:
        for proc in reversed(procs):
            _kill(proc)


def test_filter_and_eval_on_an_external_cluster_survive_a_lost_worker(cluster, tmp_path):
    address, workers = cluster
    t0 = time.monotonic()
    from opforge.filters.kernelbench import PACKAGED_SOURCE, load_problems

    kb_copy = next(p for p in load_problems(PACKAGED_SOURCE, (1,)) if p.key == "L1/19_ReLU")
    rows = [{"code": c, "task_id": f"slow{i}"} for i, c in enumerate(SLOW)] + [
        {"code": kb_copy.code, "task_id": "kb_copy"}]
    src = tmp_path / "client" / "tasks.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "client" / "run"
    cmd = _cli("filter", str(src), "--out", str(run_dir), "--scheduler", address, "--only",
               "contamination,eager", "--timeout-s", "240")  # the packaged KernelBench copy
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_KERNELBENCH"}
    env["OPFORGE_CACHE"] = str(tmp_path / "client" / "cache")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    ledger = run_dir / "ledger.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if ledger.exists() and len(ledger.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        _kill(workers["wb"][0])  # mid-run: its task in flight goes to the other worker
        killed_after = len(ledger.read_text().splitlines())
        out, err = proc.communicate(timeout=600)
    finally:
        _kill(proc)
    filter_s = time.monotonic() - t0
    assert proc.returncode == 0, err[-3000:]
    assert killed_after < len(rows)  # the kill came before the end
    ids = [json.loads(line)["task_id"] for line in ledger.read_text().splitlines()]
    assert sorted(ids) == sorted(r["task_id"] for r in rows)  # every task exactly once
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet").set_index("task_id")
    # the KernelBench index reached the workers through Dask: the copy is caught by contamination
    assert verdicts.loc["kb_copy", "reason"].startswith("contaminated"), verdicts.loc["kb_copy"].to_dict()
    assert verdicts.drop(index="kb_copy")["accepted"].all(), verdicts[["reason"]]
    assert set(verdicts["worker"]) <= {"wa", "wb"} and "wa" in set(verdicts["worker"])
    wa_home = workers["wa"][1]
    assert list((wa_home / "local").rglob("kernelbench_index.bin"))  # written by the plugin in its own dir
    assert not list(run_dir.rglob("*.bin"))
    fetched = list((run_dir / "logs").rglob("sandbox-*.log"))  # logs came back through Dask
    assert fetched and all(p.parent.parent == run_dir / "logs" for p in fetched)

    # a re-run resumes everything from the ledger on the one worker left
    t1 = time.monotonic()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    funnel = json.loads((run_dir / "funnel.json").read_text())
    assert funnel["ran_this_time"] == 0 and funnel["resumed_from_ledger"] == len(rows)
    rerun_s = time.monotonic() - t1

    # opforge eval on the same cluster: solutions that the grader decides without a build
    t2 = time.monotonic()
    dataset = tmp_path / "client" / "tasks.parquet"
    pd.DataFrame([{"task_id": TASK, "code": TASK_CODE, "data_source": "torch#2"}]).to_parquet(dataset)
    sols = tmp_path / "client" / "solutions"
    Solution({"model_new.py": "import torch\n"}).write_to(sols / TASK)  # no ModelNew: load_error
    report = tmp_path / "client" / "report"
    eval_cmd = _cli("eval", "--dataset", str(dataset), "--solutions", str(sols), "--out", str(report),
                    "--scheduler", address, "--no-compile")
    first = subprocess.run(eval_cmd, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    results = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in results] == ["load_error"] and "ModelNew" in results[0]["error"]
    second = subprocess.run(eval_cmd, capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0 and len((report / "results.jsonl").read_text().splitlines()) == 1
    eval_s = time.monotonic() - t2
    print(f"external cluster: filter with a lost worker {filter_s:.1f} s, resumed re-run {rerun_s:.1f} s, "
          f"eval and its resumed re-run {eval_s:.1f} s")
