"""``engine.timing`` on CUDA: bursts replayed as CUDA graphs, and the plain fallback (``pytest -m gpu``)."""

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")]


def test_graph_bursts_time_a_capturable_call_and_fall_back_for_one_that_synchronises():
    import torch
    from opforge.engine.timing import capture_burst, time_calls

    x = torch.randn(16, 256, 2048, device="cuda")
    out = torch.empty_like(x)

    def honest():
        torch.mul(x, 2.0, out=out).add_(1.0)

    def synchronising():
        honest()
        torch.cuda.synchronize()

    graph, error = capture_burst(honest, 4)
    assert graph is not None and error is None
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2.0 + 1.0)  # a replay does the captured work
    assert capture_burst(synchronising)[0] is None
    timed = time_calls({"a": honest, "b": honest}, "cuda", burst=4, graphs=True)
    assert all(":graph:" in t.method and t.burst == 4 and t.median_ms > 0 for t in timed.values()), timed
    plain = time_calls({"a": honest, "b": synchronising}, "cuda", burst=4, graphs=True)
    assert all(":graph:" not in t.method for t in plain.values()), plain  # one cannot be captured: none is
