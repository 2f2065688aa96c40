"""Red-team suite of the grader on CUDA (skipped without a GPU): CUDA-only hacks (side streams, returns
before the work is done, CUDA-event patching), timing tampers (static and run-time) and the CPU suite's
model-level cheats with a CUDA kernel. Run: ``python -m pytest -q -m gpu tests/test_grader_redteam_gpu.py``.
Verdict rule as in ``tests/test_grader_redteam.py``: caught (hacked / incorrect, reward -1), or correct
with a probe showing the cheat never acted; the honest CUDA control must be accepted."""

import pytest
from opforge.harness.solution import Solution

from .redteam.library_cases import LIBRARY_HACKS, LIBRARY_HONEST
from .redteam.solutions_cuda import (
    CUDA_ATTACKS,
    CUDA_HONEST,
    CUDA_HONEST_TIMING,
    CUDA_RUNTIME_TIMING_TAMPERS,
    CUDA_TIMING_TAMPERS,
    PORTABLE,
    SIDE_STREAM_ATTACKS,
    SIDE_STREAM_MIN_MS,
    on_cuda,
)
from .test_grader_redteam import ROW, _summary, assert_defeated, config

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("redteam_cuda") / "extensions"


def _evaluate(files, build_root, **over):
    from opforge.harness.evaluate import evaluate

    return evaluate(ROW, Solution(files), config(device="cuda", timing_trials=10, **over), build_root=build_root)


def test_honest_cuda_control_is_accepted(build_root):
    res = _evaluate(CUDA_HONEST, build_root)
    assert res.status == "correct" and res.reward >= 1.0 and res.hacks == [], _summary(res)
    assert res.graphs is True and not any(f.startswith("cuda_graphs_off") for f in res.flags), _summary(res)


@pytest.mark.parametrize("name", sorted(set(CUDA_ATTACKS) - set(SIDE_STREAM_ATTACKS)))
def test_cuda_only_hacks(name, tmp_path, build_root):
    probe = tmp_path / "probe.txt"
    assert_defeated(_evaluate(CUDA_ATTACKS[name](str(probe)), build_root), probe)


@pytest.mark.parametrize("name", SIDE_STREAM_ATTACKS)
def test_side_stream_work_is_caught_or_counted(name, tmp_path, build_root):
    """Work left running on another stream: flagged, or charged to the candidate (its kernel spins about
    1 ms, so a candidate time below SIDE_STREAM_MIN_MS means the timing did not wait for it)."""
    res = _evaluate(CUDA_ATTACKS[name](str(tmp_path / "probe.txt")), build_root)
    if res.status in {"hacked", "incorrect"}:
        assert res.reward == -1.0, _summary(res)
    else:
        assert res.status == "correct" and res.candidate_ms >= SIDE_STREAM_MIN_MS, _summary(res)


@pytest.mark.parametrize("name", PORTABLE)
def test_model_level_hacks_on_cuda(name, tmp_path, build_root):
    probe = tmp_path / "probe.txt"
    res = _evaluate(on_cuda(name)(str(probe)), build_root,
                    profile_compile=name == "disable_dynamo_for_the_compile_baseline")
    assert_defeated(res, probe)


@pytest.mark.parametrize("name", sorted(CUDA_TIMING_TAMPERS))
def test_timing_tamper_is_hacked_before_anything_runs_on_cuda(name, tmp_path, build_root):
    """Patched or wrapped clocks, synchronisation, events or statistics, behaviour by call count or seed,
    earlier inputs recognised: ``hacked`` with its ``timing:`` label, before any build or candidate code."""
    label, build = CUDA_TIMING_TAMPERS[name]
    probe = tmp_path / "probe.txt"
    res = _evaluate(build(str(probe)), build_root)
    assert res.status == "hacked" and res.reward == -1.0 and label in res.hacks, _summary(res)
    assert res.build_s == 0.0 and not res.build_cached and res.timing == {} and not probe.exists(), _summary(res)


@pytest.mark.parametrize("name", sorted(CUDA_RUNTIME_TIMING_TAMPERS))
def test_timing_tamper_caught_at_run_time_on_cuda(name, tmp_path, build_root):
    """Timing functions replaced through a loop variable: reported by the candidate's process, ``hacked``."""
    label, build = CUDA_RUNTIME_TIMING_TAMPERS[name]
    probe = tmp_path / "probe.txt"
    res = _evaluate(build(str(probe)), build_root)
    assert res.status == "hacked" and res.reward == -1.0 and label in res.hacks, _summary(res)
    assert any(e.startswith("cheat:") for e in probe.read_text().split()), "the tamper never ran"


def test_honest_cuda_solution_timing_itself_is_accepted(build_root):
    """CUDA events, ``torch.cuda.synchronize()``, the current stream's ``synchronize()`` and ``time`` used for
    the candidate's own log: not flagged, statically or at run time."""
    res = _evaluate(CUDA_HONEST_TIMING, build_root)
    assert res.status == "correct" and res.reward >= 1.0 and res.hacks == [], _summary(res)
    # its forward synchronises, which a CUDA graph cannot capture: every target is timed plain
    assert res.graphs is False and "cuda_graphs_off:candidate" in res.flags, _summary(res)


def test_evaluations_queued_for_memory_all_finish_and_score(build_root):
    """Eight honest evaluations at once on one GPU whose memory budget fits about two of them: the ones waiting
    for memory hold no lock of the device, so those holding memory and waiting to time never wait on them;
    every evaluation finishes ``correct`` with a reward >= 1 (no ``oom``, no ``crash``, no ``timeout``)."""
    import torch
    from opforge.harness.batch import evaluate_many
    from opforge.harness.reference_process import predicted_need_gib

    need = predicted_need_gib({"task_code": ROW["code"], "task_id": "x", "input_sets": 4, "cuda_graphs": True},
                              "cuda")
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    cfg = config(device="cuda", timing_trials=5, gpu_memory_fraction=min(1.0, 2.5 * need / total),
                 eval_timeout_s=300.0)
    pairs = [({**ROW, "task_id": f"scale_relu_{i}"}, CUDA_HONEST) for i in range(8)]
    results = evaluate_many(pairs, cfg, build_root=str(build_root), workers=8, progress=False)
    assert [r["status"] for r in results] == ["correct"] * 8, [(r["status"], r.get("error")) for r in results]
    assert all(r["reward"] >= 1.0 for r in results)


@pytest.mark.parametrize("name", sorted(LIBRARY_HONEST))
def test_gemm_by_cublas_and_convolution_by_cudnn_are_accepted(name, build_root):
    """The library policy (harness/libraries.py): a GEMM through cuBLAS and a convolution through cuDNN, each
    with its own epilogue kernel, are built, linked, loaded and accepted."""
    res = _evaluate(LIBRARY_HONEST[name], build_root)
    assert res.status == "correct" and res.reward >= 1.0 and res.hacks == [], _summary(res)


@pytest.mark.parametrize("name", sorted(LIBRARY_HACKS))
def test_other_library_calls_are_hacked_on_cuda(name, build_root):
    """A non-GEMM cuBLAS routine, a non-convolution cuDNN routine, cuSPARSE, cuRAND, cuFFT, torch's cuBLAS
    handle, Thrust: ``hacked`` (reward -1) with the source token named, before anything is built."""
    files, token = LIBRARY_HACKS[name]
    res = _evaluate(files, build_root)
    assert res.status == "hacked" and res.reward == -1.0, _summary(res)
    assert any(h.startswith("source:") and h.endswith(token) for h in res.hacks), _summary(res)


def test_the_candidates_slots_share_no_allocator_segment_with_anything_else():
    """CUDA IPC maps the whole allocator segment a shared tensor lies in: the candidate's slot set
    (``SlotSet(private=True)``, as the grader allocates it) must sit in segments that hold none of the grader's
    other tensors (the reference's slots, the inputs drawn for later rounds), whatever the slot sizes; its
    memory goes back when the set is closed."""
    import torch
    from opforge.harness.slots import SlotSet

    rset, cset = SlotSet("cuda"), SlotSet("cuda", private=True)
    mine, others = [], []
    for n in (1, 16, 1000, 4096, 2**18, 2**20 + 3, 3 * 2**20, 64, 5 * 2**20):  # small and large pool blocks
        others.append(rset.new([n], torch.float32)[1])
        mine.append(cset.new([n], torch.float32)[1])
        others.append(torch.empty(n, device="cuda"))
    held = 0
    for seg in torch.cuda.memory_snapshot():
        lo, hi = seg["address"], seg["address"] + seg["total_size"]
        ours = [t for t in mine if lo <= t.data_ptr() < hi]
        if ours:
            held += seg["total_size"]
            assert not [t for t in others if lo <= t.data_ptr() < hi], seg
    assert held >= sum(t.numel() * 4 for t in mine)
    del mine
    before = torch.cuda.memory_reserved()
    cset.close()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= before - held
