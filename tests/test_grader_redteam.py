"""Red-team suite of the grader (harness/) on CPU: every reward hack by class (verdict state, timed calls,
contract, compute, workspace, timing tamper), plus honest, wrong and broken controls.

A hack passes this suite when the grader scores it ``hacked`` or ``incorrect`` with reward -1. A cheat
that acts only where the grader lets it (steal what is in its process, tell timed calls apart, patch a
helper the grader calls) writes a ``cheat:`` line to its probe file each time it acts
(``tests/redteam/solutions.py``); ``correct`` is then accepted only when the cheat never acted (the grader
left nothing to steal or patch) and the probe shows the candidate did run. Honest controls must be
accepted (reward >= 1); wrong and broken controls keep their statuses.

One honest C++ source serves almost all solutions (they differ in ``model_new.py``; builds are cached
by source hash), one more source holds the C++ cheats. About 45 evaluations: slow on 2 cores (the timing
tampers the static audit stops take milliseconds each).
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.solution import Solution

from .redteam.solutions import (
    ATTACKS,
    BROKEN,
    HONEST_FORWARD,
    HONEST_KERNEL,
    LAYOUT_OPS,
    NEEDS_COMPILE_BASELINE,
    RUNTIME_TIMING_TAMPERS,
    TASK,
    TIMING_TAMPERS,
    WRONG,
    ZERO_TASK,
    honest,
    honest_timing,
    model_new,
)

pytestmark = pytest.mark.slow

ROW = {"task_id": "scale_relu", "code": TASK, "data_source": "torch#2"}
CAUGHT = {"hacked", "incorrect"}


def config(**over) -> EvalConfig:
    """The cheapest evaluation the grader allows (fields it does not know are left out)."""
    want = {"profile_compile": False, "timing_trials": 3, "warmup": 1, "reverify_trials": 1, **over}
    return EvalConfig(**{k: v for k, v in want.items() if k in EvalConfig.model_fields})


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("redteam") / "extensions"


def _names(kind: str) -> list[str]:
    return sorted(n for n, (k, _) in ATTACKS.items() if k == kind)


def _summary(res) -> str:
    return (f"status={res.status} reward={res.reward} hacks={res.hacks} error={(res.error or '')[:300]!r} "
            f"speedup_eager={res.speedup_eager} speedup_compile={res.speedup_compile}")


def assert_defeated(res, probe: Path) -> None:
    """Caught (hacked / incorrect, reward -1), or correct with a probe showing the cheat never acted."""
    events = probe.read_text().split() if probe.is_file() else []
    acted = sorted({e for e in events if e.startswith("cheat:")})
    print(f"verdict: {_summary(res)} cheat_events={acted}")  # shown with pytest -s / -rA
    if res.status in CAUGHT:
        assert res.reward == -1.0, _summary(res)
        return
    assert res.status == "correct", f"neither caught nor a clean verdict: {_summary(res)}"
    assert "import" in events, f"correct, but the probe never saw the candidate run: {_summary(res)}"
    assert not acted, f"attack got through ({', '.join(acted)}): {_summary(res)}"


def run_attack(name: str, tmp_path: Path, build_root: Path):
    _, build = ATTACKS[name]
    probe = tmp_path / "probe.txt"
    cfg = config(profile_compile=name in NEEDS_COMPILE_BASELINE)
    res = evaluate(ROW, Solution(build(str(probe))), cfg, build_root=build_root)
    return res, probe


# -- controls -----------------------------------------------------------------------------------------------

def test_honest_control_is_accepted(build_root):
    res = evaluate(ROW, Solution(honest()), config(), build_root=build_root)
    assert res.status == "correct" and res.reward >= 1.0 and res.hacks == [], _summary(res)
    assert res.max_error is not None and res.max_error <= 1.0


@pytest.mark.parametrize("op", sorted(LAYOUT_OPS))
def test_false_rejection_honest_layout_and_dtype_ops_are_accepted(op, build_root):
    """View / layout / dtype ops an honest forward needs (the profiler audit and the dispatcher guard
    disagreed on them)."""
    res = evaluate(ROW, Solution(honest(LAYOUT_OPS[op])), config(), build_root=build_root)
    assert res.status == "correct" and res.reward >= 1.0, _summary(res)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_controls_stay_incorrect(name, build_root):
    files, want = WRONG[name]
    res = evaluate(ROW, Solution(files), config(), build_root=build_root)
    assert res.status == want and res.reward == -1.0, _summary(res)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_controls_keep_their_status(name, build_root):
    files, want = BROKEN[name]
    res = evaluate(ROW, Solution(files), config(), build_root=build_root)
    assert res.status == want and res.reward == -1.0, _summary(res)


# -- hack classes ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", _names("verdict_state"))
def test_verdict_state_in_the_candidates_process(name, tmp_path, build_root):
    """Stealing reference outputs or the config, replacing the checks' helpers, forging the result,
    slowing the baselines, tampering and restoring."""
    assert_defeated(*run_attack(name, tmp_path, build_root))


@pytest.mark.parametrize("name", _names("timed_calls"))
def test_timed_calls_are_not_recognisable_or_unchecked(name, tmp_path, build_root):
    """Garbage on calls believed timed, answers precomputed for predictable seeds, output caches."""
    assert_defeated(*run_attack(name, tmp_path, build_root))


@pytest.mark.parametrize("name", _names("contract"))
def test_outputs_and_inputs_held_to_their_contract(name, tmp_path, build_root):
    """Lazily computed tensor subclasses, outputs aliasing inputs, inputs changed in place."""
    assert_defeated(*run_attack(name, tmp_path, build_root))


@pytest.mark.parametrize("name", _names("compute"))
def test_no_compute_outside_the_kernels(name, tmp_path, build_root):
    """Torch ops in other threads or at import, numpy / ctypes compute, C++ around the dispatcher."""
    assert_defeated(*run_attack(name, tmp_path, build_root))


# -- timing tamper --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TIMING_TAMPERS))
def test_timing_tamper_is_hacked_before_anything_runs(name, tmp_path, build_root):
    """Patched or wrapped clocks, synchronisation, events or statistics, behaviour by call count or seed, earlier
    inputs recognised: ``hacked`` with its ``timing:`` label from the static audit, before the extension is
    built or any candidate code runs (no probe line, no build, no timing)."""
    label, build = TIMING_TAMPERS[name]
    probe = tmp_path / "probe.txt"
    res = evaluate(ROW, Solution(build(str(probe))), config(), build_root=build_root)
    assert res.status == "hacked" and res.reward == -1.0 and label in res.hacks, _summary(res)
    assert res.build_s == 0.0 and not res.build_cached and res.timing == {} and not probe.exists(), _summary(res)


@pytest.mark.parametrize("name", sorted(RUNTIME_TIMING_TAMPERS))
def test_timing_tamper_the_audit_cannot_resolve_is_caught_at_run_time(name, tmp_path, build_root):
    """A timing function replaced through a loop variable (at import, or in the first call): the candidate's
    process reports the replaced function and the grader scores ``hacked`` (``timing:changed:``)."""
    label, build = RUNTIME_TIMING_TAMPERS[name]
    probe = tmp_path / "probe.txt"
    res = evaluate(ROW, Solution(build(str(probe))), config(), build_root=build_root)
    assert res.status == "hacked" and res.reward == -1.0 and label in res.hacks, _summary(res)
    assert any(e.startswith("cheat:") for e in probe.read_text().split()), "the tamper never ran"


def test_honest_solution_timing_itself_is_accepted(build_root):
    """``time`` and ``statistics`` for the candidate's own log, buffers rotated by ``(i + 1) % 2``, weights
    prepared lazily: neither the static audit nor the run-time snapshot flags it."""
    res = evaluate(ROW, Solution(honest_timing()), config(), build_root=build_root)
    assert res.status == "correct" and res.reward >= 1.0 and res.hacks == [], _summary(res)


# -- workspace ------------------------------------------------------------------------------------------------

@pytest.fixture()
def dataset(tmp_path):
    path = tmp_path / "tasks.parquet"
    pd.DataFrame([ROW]).to_parquet(path)
    return path


def _tool(ws: Path, tool: str, build_root: Path) -> dict:
    """Run ``tools/<tool>.py`` of workspace ``ws`` as an agent would; its JSON summary."""
    import os

    proc = subprocess.run([sys.executable, f"tools/{tool}.py"], cwd=ws, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OPFORGE_CACHE": str(build_root.parent)})
    out = proc.stdout
    assert "{" in out, f"tools/{tool}.py printed no summary (exit {proc.returncode}): {out[-500:]} {proc.stderr[-1500:]}"
    summary, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    return summary


WORKSPACE_EDITS = {
    # the task copy turned into one whose answer is all zeros, then an all-zeros answer
    "task_json": lambda ws: (ws / ".opforge" / "task.json").write_text(json.dumps(
        {**json.loads((ws / ".opforge" / "task.json").read_text()), "code": ZERO_TASK})),
    # a protected tool changed (here harmlessly) between tool runs
    "verify_tool": lambda ws: (ws / "tools" / "verify.py").write_text(
        (ws / "tools" / "verify.py").read_text() + "\n# edited by the agent\n"),
    # the list of protected files emptied, then a protected tool changed
    "protected_manifest": lambda ws: ((ws / ".opforge" / "protected.json").write_text("[]"),
                                      (ws / "tools" / "verify.py").write_text(
                                          (ws / "tools" / "verify.py").read_text() + "\n# edited\n")),
}


@pytest.mark.parametrize("edit", sorted(WORKSPACE_EDITS))
def test_workspace_edits_between_tool_runs(edit, dataset, tmp_path, build_root, monkeypatch):
    from opforge.harness.workspace import init_workspace

    monkeypatch.setenv("OPFORGE_CACHE", str(build_root.parent))  # the tools' build cache (and any record)
    ws = init_workspace(dataset, "scale_relu", tmp_path / "ws")
    (ws / "kernels" / "fused.cpp").write_text(HONEST_KERNEL)
    (ws / "model_new.py").write_text(model_new())
    if edit == "task_json":  # the first tool run is honest and accepted
        first = _tool(ws, "verify", build_root)
        assert first["status"] == "correct", first
        (ws / "model_new.py").write_text(model_new("        return torch.zeros_like(x)\n"))
    WORKSPACE_EDITS[edit](ws)
    after = _tool(ws, "verify", build_root)
    assert after["status"] in CAUGHT and after["reward"] == -1.0, after


# -- noise ----------------------------------------------------------------------------------------------------

def test_same_reward_alone_and_in_a_batch(build_root):
    """The same honest solution, alone and as four copies evaluated at once by the batch API (as
    ``opforge eval`` runs them), gets one reward. The solution runs its kernel 32 times per call, so alone
    it sits well below eager (reward 1) and only timing that depends on the neighbours (eager slowed by
    evaluations timing at once) should move it across the 1.05 milestone."""
    from opforge.harness.batch import evaluate_many

    files = honest("        for _ in range(31):\n            opforge_kernels.fused_scale_relu(x, self.scale)\n"
                   + HONEST_FORWARD)
    alone = evaluate(ROW, Solution(files), config(), build_root=build_root)
    assert alone.status == "correct", _summary(alone)
    pairs = [({**ROW, "task_id": f"scale_relu_{i}"}, files) for i in range(4)]
    batch = evaluate_many(pairs, config(), build_root=str(build_root), progress=False, workers=4)
    assert [r["status"] for r in batch] == ["correct"] * 4, batch
    detail = (
        f"alone: reward {alone.reward} (eager {alone.eager_ms} ms, candidate {alone.candidate_ms} ms); batch: "
        + "; ".join(f"reward {r['reward']} (eager {r['eager_ms']} ms, candidate {r['candidate_ms']} ms)"
                    for r in batch))
    print(detail)
    assert [r["reward"] for r in batch] == [alone.reward] * 4, detail


STALL_HEAD = "import time\n"
STALL_FORWARD = '''        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > @AFTER@:
            time.sleep(@SLEEP@)
        return opforge_kernels.fused_scale_relu(x, self.scale)
'''


@pytest.mark.parametrize("after, sleep, limit", [(None, 100, "2 s"), (1, 100, "30 s")],
                         ids=["stalls_once_timing_starts", "stalls_in_verification"])
def test_a_stalling_candidate_cannot_hold_the_device(after, sleep, limit, build_root, monkeypatch):
    """A candidate whose calls stall (only in the timed rounds: the verification and warm-up bursts come
    first; or from its second call) ends ``timeout`` at the per-request bound (``TIMED_CALL_FLOOR_S``,
    ``UNTIMED_CALL_FLOOR_S``), not at the evaluation timeout: while it stalls it holds the device's timing
    lock, exclusively in a timed round, so every other evaluation and filter sandbox would wait. Its call
    counter is a timing tamper (``hacked`` before it runs); the per-request bound is tested with the timing
    audit switched off, as for a counter the audit could not see."""
    import opforge.harness.timing_tamper as tamper

    cfg = config(burst_calls=4)  # a fixed burst size: the calls before the first timed burst are known
    if after is None:
        after = (cfg.correct_trials + cfg.warmup) * cfg.burst_calls
    forward = STALL_FORWARD.replace("@AFTER@", str(after)).replace("@SLEEP@", str(sleep))
    files = honest(forward, STALL_HEAD)
    flagged = evaluate(ROW, Solution(files), cfg, build_root=build_root)
    assert flagged.status == "hacked" and "timing:call_count:self.calls" in flagged.hacks, _summary(flagged)
    monkeypatch.setattr(tamper, "timing_tampers", lambda source, filename="model_new.py": [])
    res = evaluate(ROW, Solution(files), config(eval_timeout_s=90.0, burst_calls=4), build_root=build_root)
    assert res.status == "timeout" and res.reward == -1.0, _summary(res)
    assert f"candidate call ran past its limit of {limit}" in (res.error or ""), _summary(res)
