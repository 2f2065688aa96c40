"""The warm grader (``OPFORGE_WARM_GRADER=1``: ``harness.grader_service``, ``harness.warm``): long-lived grader
processes that keep the reference server of a task between its evaluations decide as a grader process per
evaluation does, draw the weights again for every evaluation, and never keep a reference that cannot serve the
next evaluation exactly as a fresh one would."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.solution import Solution

from .harness_cases import CHEATS, EXPECTED, HONEST, TASK, model_new

ROW = {"task_id": "scale_relu", "code": TASK, "data_source": "torch#2"}
FAST = EvalConfig(profile_compile=False, timing_trials=5, warmup=1)


@pytest.fixture
def warm(monkeypatch):
    """The warm grader on, with a pool of grader processes of this test's own (closed after it)."""
    from opforge.harness import grader_service

    monkeypatch.setenv("OPFORGE_WARM_GRADER", "1")
    pool = grader_service.GraderPool()
    monkeypatch.setattr(grader_service, "POOL", pool)
    yield pool
    pool.close()


def test_a_warm_reference_serves_every_later_evaluation_of_its_task_with_the_same_verdicts(warm, tmp_path):
    """One grader process keeps the reference server of a task: the second and later evaluations of the same task
    and settings reuse it (``warm_reference``), and still an honest kernel is correct (so the candidate got the
    weights the reference drew again), a wrong one incorrect, a hack hacked; another task gets a fresh reference
    (a setup that differs in a setting: ``test_a_warm_reference_draws_the_weights_a_fresh_one_draws_from_the_same_seed``)."""
    build_root = tmp_path / "ext"
    first = evaluate(ROW, Solution(HONEST), FAST, build_root=build_root)
    assert first.status == "correct" and first.reward >= 1.0 and not first.warm_reference, first
    wrong = evaluate(ROW, Solution({"model_new.py": model_new("        return torch.zeros_like(x) + 0.5\n")}), FAST,
                     build_root=build_root)
    assert wrong.reward == -1.0 and wrong.status in ("incorrect", "hacked") and wrong.warm_reference, wrong
    name = next(n for n in sorted(CHEATS) if EXPECTED[n] not in ("correct", "incorrect")
                and not EXPECTED[n].startswith(("policy", "source", "symbol")))
    hacked = evaluate(ROW, Solution(CHEATS[name]), FAST, build_root=build_root)
    assert hacked.status == "hacked" and any(h.startswith(EXPECTED[name]) for h in hacked.hacks), hacked
    assert hacked.warm_reference, hacked
    again = evaluate(ROW, Solution(HONEST), FAST, build_root=build_root)
    assert again.status == "correct" and again.warm_reference and again.candidate_ms > 0, again
    other = {**ROW, "task_id": "other", "code": TASK.replace("+ 1.0", "+ 2.0")}
    fresh = evaluate(other, Solution(HONEST), FAST, build_root=build_root)
    assert not fresh.warm_reference and fresh.reward == -1.0, fresh  # the kernel adds 1, this task 2
    assert len([s for s in warm.all if s.started]) == 1  # one grader process served them all, in turn


def test_an_evaluation_goes_to_the_grader_process_that_graded_its_task_lately(monkeypatch):
    """``GraderPool`` lends an idle grader process that graded the same task and settings lately before any other,
    and starts a new one only when none is idle."""
    from opforge.harness import grader_service

    served: list[tuple[int, str]] = []

    def fake_grade(self, request, timeout_s):
        served.append((id(self), request["task"]["task_id"]))
        self.server = object()  # as if its grader process were running
        return {"ok": True}

    monkeypatch.setattr(grader_service.GraderService, "grade", fake_grade)
    monkeypatch.setattr(grader_service.GraderService, "close", lambda self: setattr(self, "server", None))
    pool = grader_service.GraderPool()
    req = {"config": {}, "variants": [], "alone": False}
    a, b = {**req, "task": {"task_id": "a", "code": "A"}}, {**req, "task": {"task_id": "b", "code": "B"}}
    pool.grade(a, 1.0)
    first = pool.idle[0]
    pool.grade(b, 1.0)
    assert len(pool.all) == 1 and served[1][0] == id(first)  # one idle process: lent again
    assert first.recent == [grader_service.affinity(a), grader_service.affinity(b)]
    first.recent = [grader_service.affinity(b)]
    second = grader_service.GraderService()
    second.server, second.recent = object(), [grader_service.affinity(a)]
    pool.idle.insert(0, second)
    pool.all.append(second)
    pool.grade(a, 1.0)
    assert served[-1][0] == id(second)  # the one that graded task a lately, though another was idle too
    pool.grade(b, 1.0)
    assert served[-1][0] == id(first)
    pool.close_idle()
    assert all(s.server is None and not s.recent for s in pool.all)


def _setup_message(code: str, seed: int) -> dict:
    return {"op": "setup", "task_code": code, "task_id": "t", "seed": seed, "device": "cpu", "threads": 1,
            "allow_tf32": False, "variants": [], "input_sets": 2, "burst_target_ms": 0.0, "burst_calls": None,
            "gpu_memory_fraction": 0.9, "gpu_admit_gib": 4.0}


def _weights(blob: bytes) -> dict:
    import io

    return torch.load(io.BytesIO(blob), weights_only=True)


def test_a_warm_reference_draws_the_weights_a_fresh_one_draws_from_the_same_seed():
    """A kept reference server's next ``setup`` (a fresh seed) gives the candidate's server the weights and init
    inputs a fresh reference server would give for that seed, and its eager model computes with them."""
    from opforge.harness.reference_process import setup

    server, _, first = setup(_setup_message(TASK, 11), None)
    reply, again = server.handlers["setup"](_setup_message(TASK, 22), None)
    _, _, fresh = setup(_setup_message(TASK, 22), None)
    assert reply["ok"] is True
    got, want = _weights(again), _weights(fresh)
    assert got["init_inputs"] == want["init_inputs"] == [256]
    assert torch.equal(got["state"]["scale"], want["state"]["scale"])
    assert not torch.equal(got["state"]["scale"], _weights(first)["state"]["scale"])
    x = torch.randn(4, 256)
    assert torch.equal(server.targets["eager"](x), torch.relu(x * want["state"]["scale"] + 1.0))
    # a setup that differs in anything but the seed is refused: the grader starts a fresh reference
    refused, _ = server.handlers["setup"]({**_setup_message(TASK, 33), "input_sets": 5}, None)
    assert refused["ok"] is False and refused["reusable"] is False


def test_a_reference_whose_init_inputs_depend_on_the_seed_is_not_reused():
    """Init inputs drawn at random differ between seeds, so the same model object cannot stand for the new
    evaluation's: the kept server refuses, and the grader starts a fresh one."""
    from opforge.harness.reference_process import setup

    code = TASK.replace("return [256]", "return [256, float(torch.rand(1))]").replace(
        "def __init__(self, channels):", "def __init__(self, channels, tag=None):")
    server, _, _ = setup(_setup_message(code, 1), None)
    refused, _ = server.handlers["setup"](_setup_message(code, 2), None)
    assert refused["ok"] is False and refused["reusable"] is False


def test_an_evaluation_whose_kept_reference_refuses_gets_a_fresh_one(warm, tmp_path):
    """A task whose init inputs are drawn at random: the reference kept after the first evaluation refuses the
    second's setup, and the second evaluation goes on with a fresh reference, to the same verdict."""
    code = TASK.replace("return [256]", "return [256, float(torch.rand(1))]").replace(
        "def __init__(self, channels):", "def __init__(self, channels, tag=None):")
    row = {"task_id": "tagged", "code": code, "data_source": "torch#2"}
    zeros = {"model_new.py": "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                             "    def __init__(self, channels, tag=None):\n        super().__init__()\n"
                             "        self.scale = nn.Parameter(torch.ones(channels))\n\n"
                             "    def forward(self, x):\n        return torch.zeros_like(x)\n"}
    first = evaluate(row, Solution(zeros), FAST, build_root=tmp_path / "ext")
    second = evaluate(row, Solution(zeros), FAST, build_root=tmp_path / "ext")
    assert first.status == second.status == "incorrect", (first, second)
    assert not first.warm_reference and not second.warm_reference
    log = Path(second.logs["grader"]).read_text()  # the grader process's line per evaluation
    assert "(1 reused so far" in log, log[-1500:]  # the kept reference was taken, refused, and replaced
