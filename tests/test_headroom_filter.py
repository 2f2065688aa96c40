"""``roofline`` and ``headroom`` filters (filters/headroom.py): ``trivial:no_headroom``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opforge.filters import headroom
from opforge.filters.chain import FILTER_NAMES, FilterSettings, make_chain, run_chain
from opforge.filters.headroom import HeadroomFilter, HeadroomScreenFilter, RooflineFilter, resolve_peaks
from opforge.task.peaks import H100_SXM, H200_SXM

from .filter_tasks import GOOD, task

SINGLE = task("        return self.lin(x)")
NO_META = task("        return self.lin(x)[torch.nonzero(x[:, 0] > 0)[:, 0]]")


@dataclass
class _Run:  # what the filters read of a TaskRun
    code: str
    task_id: str = "t"
    device: str = "cpu"


def test_roofline_runs_before_execution_and_headroom_after_the_timing():
    names = list(FILTER_NAMES)
    assert names.index("contamination") < names.index("roofline") < names.index("eager")
    assert names.index("runtime_screen") + 1 == names.index("headroom_screen") < names.index("compile")
    assert names.index("runtime") < names.index("headroom") == len(names) - 1


def test_headroom_screen_rejects_only_what_headroom_would():
    """room <= eager / roofline <= screen / (slack * roofline): below min_room there, headroom would reject."""
    f = HeadroomScreenFilter()
    cuda = _Run(GOOD, device="cuda")

    def verdict(screen_ms, roofline_ms, run=cuda, flt=f):
        return flt.decide(flt.score(run, {"runtime_screen": {"screen_ms": screen_ms},
                                          "roofline": {"roofline_ms": roofline_ms}}))

    low = verdict(0.17, 0.1)  # bound 0.17 / 0.09 = 1.89 < 2
    assert low.reason == "trivial:no_headroom" and low.metrics["room_bound"] == pytest.approx(1.8889, abs=1e-4)
    assert verdict(0.19, 0.1).accepted  # bound 2.11: the precise times decide later
    assert verdict(0.17, 0.1, run=_Run(GOOD)).accepted  # CPU: no GPU times, no rule
    assert verdict(None, 0.1).accepted and verdict(0.17, None).accepted
    assert verdict(0.17, 0.1, flt=HeadroomScreenFilter(min_room=1.5)).accepted


def test_the_screen_takes_headroom_min_room_and_runs_only_with_headroom():
    def screen(settings):
        return next((f for f in make_chain(settings) if f.name == "headroom_screen"), None)

    assert screen(FilterSettings(device="cpu")).thresholds["min_room"] == 2.0
    assert screen(FilterSettings(device="cpu", thresholds={"headroom": {"min_room": 1.5}})).thresholds[
        "min_room"] == 1.5
    assert screen(FilterSettings(device="cpu", skip=["headroom"])) is None


def test_roofline_scores_on_the_default_peaks_and_only_records_by_default():
    v = RooflineFilter()(_Run(SINGLE))
    assert v.accepted and v.metrics["peaks"] == "h200" and v.metrics["peaks_source"] == "cpu run: default"
    assert v.metrics["fusion_gain"] == pytest.approx(1.0) and v.metrics["ops"][0]["op"] == "nn.Linear"
    assert v.metrics["roofline_ms"] > 0 and v.metrics["op_count"] == 1
    good = RooflineFilter()(_Run(GOOD)).metrics["fusion_gain"]
    assert good > 1.5  # linear + relu + scale: the epilogue's round trips are what fusion saves


def test_roofline_with_a_floor_rejects_below_it():
    f = RooflineFilter(min_fusion_gain=1.1)
    assert f(_Run(SINGLE)).reason == "trivial:no_headroom"
    assert f(_Run(GOOD)).accepted


def test_the_default_floor_rejects_multi_op_tasks_with_little_to_fuse_on_cuda_only():
    """``auto``: on CUDA a task of two or more ops below CUDA_MIN_FUSION_GAIN is rejected; one op, or a CPU run,
    is left to the room."""
    f = RooflineFilter()
    assert f.thresholds["min_fusion_gain"] == "auto" and headroom.CUDA_MIN_FUSION_GAIN == 1.25
    big_gemm = task("        return torch.relu(self.lin(x))", inputs="[torch.randn(4096, 4096)]", init_inputs="[4096]")
    weak = f(_Run(big_gemm, device="cuda"))
    assert weak.metrics["op_count"] == 2 and weak.metrics["fusion_gain"] < 1.25
    assert weak.reason == "trivial:no_headroom"
    assert f(_Run(big_gemm)).accepted  # CPU: recorded only
    assert f(_Run(SINGLE, device="cuda")).accepted  # one op: nothing to fuse, judged by its room
    strong = f(_Run(GOOD, device="cuda"))
    assert strong.accepted and strong.metrics["fusion_gain"] >= 1.25
    assert RooflineFilter(min_fusion_gain=None)(_Run(big_gemm, device="cuda")).accepted
    with pytest.raises(ValueError, match="min_fusion_gain"):
        RooflineFilter(min_fusion_gain="high")


def test_a_task_without_meta_kernels_is_not_judged():
    v = RooflineFilter(min_fusion_gain=1.1)(_Run(NO_META))
    assert v.accepted and "NotImplementedError" in v.metrics["roofline_error"]
    assert "fusion_gain" not in v.metrics


def test_peaks_resolution(monkeypatch):
    assert resolve_peaks("h100", "cuda") == (H100_SXM, "threshold")
    assert resolve_peaks("auto", "cpu")[0] is H200_SXM
    monkeypatch.setattr(headroom, "visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    assert resolve_peaks("auto", "cuda") == (H100_SXM, "GPU 'NVIDIA H100 80GB HBM3'")
    monkeypatch.setattr(headroom, "visible_gpu_name", lambda: "NVIDIA A100-SXM4-80GB")
    peaks, source = resolve_peaks("auto", "cuda")
    assert peaks is H200_SXM and "not listed" in source
    with pytest.raises(ValueError, match="unknown device peaks"):
        resolve_peaks("v100", "cuda")


def _decide(gain, room, **thresholds):
    return HeadroomFilter(**thresholds).decide({"fusion_gain": gain, "room": room})


def test_headroom_rejects_when_a_perfect_kernel_wins_under_min_room():
    assert _decide(1.05, 1.2).reason == "trivial:no_headroom"
    assert _decide(3.0, 1.9).reason == "trivial:no_headroom"  # fusable, but Inductor is already near the ideal
    assert _decide(1.05, 3.0).accepted  # eager / Inductor far from the ideal kernel
    assert _decide(2.0, 2.0).accepted  # at the threshold
    assert _decide(1.05, None).accepted  # no GPU times: the rule does not apply
    assert _decide(None, 1.0).reason == "trivial:no_headroom"  # room known, gain untraced: room decides
    assert _decide(1.25, 1.2, min_room=1.1).accepted


def test_headroom_room_is_the_better_measured_time_over_the_roofline():
    f = HeadroomFilter()
    earlier = {"roofline": {"roofline_ms": 0.5, "fusion_gain": 1.02, "peaks": "h200"},
               "runtime": {"eager_ms": 1.0, "compile_ms": 0.6}}
    m = f.score(_Run(SINGLE, device="cuda"), earlier)
    assert (m["best_ms"], m["room"]) == (0.6, 1.2) and f.decide(m).reason == "trivial:no_headroom"
    cpu = f.score(_Run(SINGLE), earlier)  # CPU times say nothing about the GPU roofline
    assert cpu["eager_ms"] is None and cpu["room"] is None and f.decide(cpu).accepted


def test_headroom_measures_the_roofline_itself_when_that_filter_was_left_out():
    m = HeadroomFilter().score(_Run(GOOD, device="cuda"), {"runtime": {"eager_ms": 2.0}})
    assert m["fusion_gain"] > 1.5 and m["room"] == pytest.approx(2.0 / m["roofline_ms"], rel=1e-3)


def test_the_chain_hands_headroom_the_earlier_metrics():
    from opforge.engine.execution import TaskRun

    chain = make_chain(FilterSettings(skip=["contamination", "compile", "trivial", "determinism", "degenerate"]))
    res = run_chain(TaskRun(GOOD, "good"), chain)
    assert res["accepted"], res["reason"]
    assert res["metrics"]["headroom"]["fusion_gain"] == res["metrics"]["roofline"]["fusion_gain"] > 1.5
    assert res["metrics"]["headroom"]["room"] is None  # CPU
    res = run_chain(_Run(SINGLE), make_chain(FilterSettings(only=["roofline"],
                                                            thresholds={"roofline": {"min_fusion_gain": 1.1}})))
    assert res["reason"] == "trivial:no_headroom" and res["filter"] == "roofline"


def test_the_card_section_reports_the_distributions_and_the_room():
    import pandas as pd
    from opforge.data_cards.render import render_section
    from opforge.pipeline.headroom_card import headroom_context

    rows = pd.DataFrame({"fusion_gain": [1.0, 1.05, 2.0, 3.0, None], "roofline_ms": [0.5, 1.0, 0.1, 0.2, None],
                         "eager_ms": [1.0, 1.2, 1.0, 1.0, 2.0], "compile_ms": [0.6, None, 0.5, 2.0, 1.0]})
    gpu = headroom_context(rows, True, H200_SXM.describe(), "GPU 'NVIDIA H200'")
    assert gpu["n"] == 4 and gpu["low_gain_share"] == 0.5
    assert gpu["room_share"] == 0.5  # rooms 1.2, 1.2, 5, 5
    assert gpu["fusion_gain"]["p50"] == pytest.approx(1.525)
    text = render_section("headroom.md.j2", {"headroom": gpu})
    assert "50.0 % of the tasks have a fusion gain below 1.1" in text and "4.8 TB/s" in text
    assert "at least 2x faster than the better of eager" in text and "50.0 % of them" in text
    cpu = headroom_context(rows, False, H200_SXM.describe(), "cpu run: default")
    text = render_section("headroom.md.j2", {"headroom": cpu})
    assert cpu["room"] is None and "room =" not in text and "these peaks stand in" in text
    empty = headroom_context(rows.drop(columns=["fusion_gain", "roofline_ms"]), False, "x", "y")
    assert empty["n"] == 0 and "No task of this run has a roofline" in render_section("headroom.md.j2",
                                                                                         {"headroom": empty})
