"""The trainer's front door: what a new user does first with the reward (issue: reward throughput, front door).

``KernelReward`` takes the ``datasets.Dataset`` that the README's ``load_dataset`` returns; a wrong input names
itself; one local cluster serves the reward's life; a script without a ``__main__`` guard works on CPU; small rows
for a CPU smoke test; the GRPO wiring example runs offline on a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.dataset import DatasetError, input_bytes, load_tasks, small_tasks

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "releases" / "opforge-ops-6k"
TASKS_JSONL = ROOT / "benchmarks" / "harness_solutions" / "tasks.jsonl"


def _rows(n: int = 3) -> list[dict]:
    with open(TASKS_JSONL) as fh:
        return [json.loads(line) for line in fh][:n]


def test_load_tasks_takes_a_datasets_dataset_and_a_dataset_dict():
    datasets = pytest.importorskip("datasets")
    rows = _rows()
    ds = datasets.Dataset.from_list(rows)
    tasks = load_tasks(ds)
    assert list(tasks.index) == [r["task_id"] for r in rows]
    assert list(tasks["code"]) == [r["code"] for r in rows]
    both = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(rows[:1])})
    assert len(load_tasks(both)) == len(rows)
    assert len(load_tasks(both, split="test")) == 1
    with pytest.raises(DatasetError, match="no split 'validation'"):
        load_tasks(both, split="validation")
    with pytest.raises(DatasetError, match="no 'code' column"):
        load_tasks(datasets.Dataset.from_list([{"task_id": "a", "text": "x"}]))


@pytest.mark.parametrize("bad", [42, {"code": "x"}, ["a", "b"]])
def test_load_tasks_names_an_input_of_another_type(bad):
    with pytest.raises(DatasetError, match=f"cannot read tasks from a {type(bad).__name__}"):
        load_tasks(bad)


def test_kernel_reward_takes_what_load_dataset_returns():
    datasets = pytest.importorskip("datasets")
    from opforge.harness import EvalConfig, KernelReward

    ds = datasets.load_dataset(str(RELEASE), split="train")
    reward = KernelReward(ds, EvalConfig(device="cpu"))
    assert len(reward.tasks) == len(ds)
    assert reward.dataset == "<Dataset>"
    # a completion without files scores -1 and opens no cluster
    assert reward(["no files here"], task_id=[ds[0]["task_id"]]) == [-1.0]
    assert reward._own is None


def test_small_tasks_keeps_rows_by_input_bytes():
    rows = pd.DataFrame([
        {"task_id": "a", "code": "", "input_shapes": "[[4, 1024, 1024]]", "dtype": "float32"},    # 16.8 MB
        {"task_id": "b", "code": "", "input_shapes": "[[4, 1024, 1024]]", "dtype": "bfloat16"},   # 8.4 MB
        {"task_id": "c", "code": "", "input_shapes": "[[64, 1024, 1024], [8]]", "dtype": "float32"},
        {"task_id": "d", "code": "", "input_shapes": None, "dtype": "float32"},
    ])
    assert input_bytes(rows.iloc[0]) == 4 * 1024 * 1024 * 4
    assert input_bytes(rows.iloc[2]) == (64 * 1024 * 1024 + 8) * 4
    assert input_bytes(rows.iloc[3]) is None
    assert list(small_tasks(rows, max_input_mb=10)["task_id"]) == ["b"]
    assert list(small_tasks(rows, max_input_mb=20)["task_id"]) == ["a", "b"]


def _run_script(tmp_path: Path, body: str, timeout: int) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


@pytest.mark.parametrize("guarded", [False, True])
def test_unguarded_main_call_sees_the_guard(tmp_path, guarded):
    call = "print('RESULT', unguarded_main_call())"
    body = "from opforge.harness.rl import unguarded_main_call\n"
    body += (f"if __name__ == '__main__':\n    {call}\n" if guarded else f"{call}\n")
    # a call from a function that the script's top level calls counts where the top level calls it
    body += "def f():\n    return unguarded_main_call()\n"
    body += ("if __name__ == '__main__':\n    print('NESTED', f())\n" if guarded else "print('NESTED', f())\n")
    out = _run_script(tmp_path, body, 120)
    assert out.returncode == 0, out.stderr
    assert f"RESULT {not guarded}" in out.stdout
    assert f"NESTED {not guarded}" in out.stdout


@pytest.mark.slow
def test_an_unguarded_script_gets_rewards_from_one_cluster(tmp_path):
    """A plain script without ``if __name__ == "__main__":`` calls the reward twice: both calls are scored
    (a model_new.py that does not import is a load error, -1) on the same local cluster."""
    row = _rows(1)[0]
    body = f"""
        import pandas as pd
        from opforge.harness import EvalConfig, KernelReward

        row = {row!r}
        reward = KernelReward(pd.DataFrame([row]), EvalConfig(device="cpu"), workers=1)
        bad = "```python model_new.py\\nraise RuntimeError('not a model')\\n```"
        print("FIRST", reward([bad], task_id=[row["task_id"]]))
        own = reward._own
        print("SECOND", reward([bad], task_id=[row["task_id"]]), reward._own is own)
        print("STATUS", reward.last_results[0]["status"])
    """
    out = _run_script(tmp_path, body, 600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FIRST [-1.0]" in out.stdout
    assert "SECOND [-1.0] True" in out.stdout
    assert "STATUS load_error" in out.stdout


@pytest.mark.slow
def test_grpo_wiring_example_runs_offline_on_cpu(tmp_path):
    pytest.importorskip("trl")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_wiring.py"), "--dataset", str(RELEASE),
                          "--mode", "reward", "--device", "cpu", "--max-steps", "1", "--max-completion-length", "8",
                          "--tasks", "2", "--output-dir", str(tmp_path / "grpo")],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trained 1 step(s) on cpu" in out.stdout
    assert (tmp_path / "grpo" / "tiny-model" / "config.json").exists()
