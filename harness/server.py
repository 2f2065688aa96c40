"""Model server child: ``python -m opforge.harness.server (candidate|reference) FD``.

Answers the grader's messages (``engine.protocol``) on the socket ``FD`` until ``exit`` or until the grader
closes it. The role's module builds what it serves:

* ``candidate`` (``harness.candidate_process``): the dispatcher guard first, then the extension,
  ``model_new.py`` and ``ModelNew`` with the reference's weights; one target, ``candidate``.
* ``reference`` (``harness.reference_process``): the task's ``Model``; targets ``eager`` and ``compile``
  (``torch.compile``, built on its first call); it also draws inputs for the grader.

``call`` is the same for both roles (``serve_call``), so the protocol's cost is the same on both sides of
a speed-up.
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from opforge.engine.execution import flatten_tensors, is_oom
from opforge.harness.guard import aliases
from torch.utils._python_dispatch import _disable_current_modes


class Server:
    """What a role's setup leaves for the call loop.

    Attributes:
        targets: name -> callable(*args) returning the outputs.
        device: "cpu" or "cuda".
        slots: the shared tensors (``harness.slots.map_slots``), set by the ``slots`` message.
        owned: name -> tensor the outputs must not alias beyond the inputs (weights), or {}.
        after_call: returns findings to add to every call reply (the candidate's guard record and config).
        before_call: run before each ``call`` message is served, outside its timing (the reference's: waits once for
            its compiler warm-up, ``reference_process.warm_compiler``); nothing by default.
        handlers: extra ``op`` -> handler(msg, blob) -> (reply, blob) (the reference's ``draw``).
        wake: one element on ``device``, filled before each burst (``serve_call``).
        graphs: (target, call key) -> (CUDA graph of that call, its ``_one_call`` record), captured by
            ``serve_call`` when the grader asks for graphs; ``graph_error``: target -> why it could not be.
    """

    def __init__(self, device: str):
        self.device = device
        self.targets: dict[str, Callable[..., Any]] = {}
        self.slots: list[torch.Tensor] = []
        self.owned: dict[str, torch.Tensor] = {}
        self.after_call: Callable[[], dict[str, Any]] = dict
        self.before_call: Callable[[], None] = noop
        self.handlers: dict[str, Callable] = {}
        self.wake = torch.zeros(1, device=device)
        self.graphs: dict[tuple[str, str], tuple[Any, dict[str, Any]]] = {}
        self.graph_error: dict[str, str] = {}
        self.graph_pools: dict[str, Any] = {}
        self.graph_stream: Any = None


def noop() -> None:
    """``Server.before_call``'s default: nothing."""


def output_meta(t: torch.Tensor) -> dict[str, Any]:
    """What the grader checks of one output without seeing it: exact class, layout, device, shape, dtype."""
    return {"plain": type(t) is torch.Tensor, "strided": t.layout == torch.strided, "device": t.device.type,
            "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def serve_call(server: Server, msg: dict[str, Any]) -> dict[str, Any]:
    """Run one ``call`` (see ``engine.protocol``): a burst of the target's ``calls`` back to back, each on its
    own input slots, its outputs copied into its output slots right after it (on the current stream, so work
    the call left on a stream it did not join back is not in them) only when their count, shapes, dtypes and
    devices match the slots; then one device synchronisation (every stream) and the reply. ``hint_ms``: this
    process's ``time.perf_counter`` around the whole burst, synchronisation included
    (``engine.timing.run_burst``'s method). The server's own part of each call (the outputs' checks and copies)
    runs outside any dispatch mode of the process (the candidate's guard), so it costs both sides the same.
    Before the timed span, a one-element fill and a synchronisation on CUDA make this process's context the
    device's current one, so the switch from the grader's L2 flush is not charged to the burst's first call.

    CUDA graphs (``msg["graph"]``, CUDA only): a call whose graph exists is replayed instead: the graph holds
    the call and its outputs' copies into its output slots, captured (``engine.timing.capture_burst``) after
    the first burst that ran the call plainly, with its record (checks, aliases) taken at capture. A burst is
    replayed only when every one of its calls has a graph; the reply says ``graphed``. A target that cannot be
    captured is reported in ``graph_error`` and its calls stay plain."""
    fn = server.targets[msg["target"]]
    plans = [([server.slots[a["slot"]] if "slot" in a else a["value"] for a in c["inputs"]],
              [server.slots[i] for i in c["outputs"]]) for c in msg["calls"]]
    use_graphs = bool(msg.get("graph")) and server.device == "cuda" and msg["target"] not in server.graph_error
    keys = [(msg["target"], repr((c["inputs"], c["outputs"]))) for c in msg["calls"]]
    replay = use_graphs and all(k in server.graphs for k in keys)
    done: list[dict[str, Any]] = []
    if server.device == "cuda":
        with _disable_current_modes():
            server.wake.fill_(0)
            torch.cuda.synchronize()
    if replay:
        graphs = [server.graphs[k][0] for k in keys]
        t0 = time.perf_counter()
        try:
            for g in graphs:
                g.replay()
            torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - every failure of the call is reported
            return {"ok": False, "oom": is_oom(exc) if isinstance(exc, Exception) else False,
                    "error": f"{type(exc).__name__}: {str(exc)[:500]}", **server.after_call()}
        hint_ms = (time.perf_counter() - t0) * 1e3
        return {"ok": True, "hint_ms": hint_ms, "graphed": True, "calls": [server.graphs[k][1] for k in keys],
                **server.after_call()}
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            for inputs, outs in plans:
                got = flatten_tensors(fn(*inputs))
                with _disable_current_modes():
                    done.append(_one_call(server, inputs, outs, got))
            if server.device == "cuda":
                torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001 - every failure of the call is reported (the guard's too)
        return {"ok": False, "oom": is_oom(exc) if isinstance(exc, Exception) else False,
                "error": f"{type(exc).__name__}: {str(exc)[:500]}", **server.after_call()}
    hint_ms = (time.perf_counter() - t0) * 1e3
    reply = {"ok": True, "hint_ms": hint_ms, "graphed": False, "calls": done}
    if use_graphs:
        try:
            _capture(server, msg["target"], fn, plans, keys)
        except BaseException as exc:  # noqa: BLE001 - the guard's stop inside a captured call, reported with its record
            return {"ok": False, "oom": is_oom(exc) if isinstance(exc, Exception) else False,
                    "error": f"{type(exc).__name__}: {str(exc)[:500]}", **server.after_call()}
        if msg["target"] in server.graph_error:
            reply["graph_error"] = server.graph_error[msg["target"]]
    return {**reply, **server.after_call()}


def _capture(server: Server, target: str, fn: Callable[..., Any], plans: list, keys: list[tuple[str, str]]
             ) -> None:
    """Capture each call of ``plans`` that has no graph yet (``serve_call``): the call, run under the process's
    dispatch modes as a plain call is, then its outputs' copies into its slots outside them. The graphs of a
    target share one memory pool (its calls replay one after another on one stream). On the first failure the
    target's graphs are dropped and ``server.graph_error[target]`` says why."""
    from opforge.engine.timing import capture_burst

    with _disable_current_modes():
        if server.graph_stream is None:
            server.graph_stream = torch.cuda.Stream()
        pool = server.graph_pools.setdefault(target, torch.cuda.graph_pool_handle())
    for key, (inputs, outs) in zip(keys, plans, strict=True):
        if key in server.graphs:
            continue
        record: dict[str, Any] = {}

        def one(inputs=inputs, outs=outs, record=record) -> None:
            with torch.no_grad():
                got = flatten_tensors(fn(*inputs))
                with _disable_current_modes():
                    record.clear()
                    record.update(_one_call(server, inputs, outs, got))

        with torch.no_grad():
            graph, error = capture_burst(one, 1, stream=server.graph_stream, pool=pool)
        if graph is None:
            server.graph_error[target] = error or "capture failed"
            print(f"CUDA graph capture of {target} failed: {server.graph_error[target]}", file=sys.stderr, flush=True)
            for k in [k for k in server.graphs if k[0] == target]:
                del server.graphs[k]
            return
        server.graphs[key] = (graph, dict(record))


def _one_call(server: Server, inputs: list[Any], outs: list[torch.Tensor], got: list[torch.Tensor]
              ) -> dict[str, Any]:
    """One call of a burst: its outputs' ``output_meta``, whether they were copied into ``outs``, and the
    inputs or weights they alias (``harness.guard.aliases``)."""
    meta = [output_meta(g) for g in got]
    fits = len(got) == len(outs) and all(
        m["plain"] and m["strided"] and g.shape == s.shape and g.dtype == s.dtype and g.device == s.device
        for g, s, m in zip(got, outs, meta, strict=False))
    if fits:
        for g, s in zip(got, outs, strict=True):
            s.copy_(g)
    named = {f"input{i}": x for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
    return {"outputs": meta, "copied": fits, "aliases": aliases(got, {**named, **server.owned})}


def main() -> None:
    from multiprocessing.connection import Connection

    from opforge.engine.protocol import ProtocolError, recv, send
    from opforge.harness.slots import map_slots

    role, fd = sys.argv[1], int(sys.argv[2])
    conn = Connection(fd)
    try:
        msg, blob = recv(conn, allow_blob=True, max_bytes=1 << 31)
        if msg.get("op") == "ping":  # a spare server (harness.warm): imported and ready, then its setup
            send(conn, {"ok": True})
            msg, blob = recv(conn, allow_blob=True, max_bytes=1 << 31)
    except ProtocolError:
        return
    if role == "candidate":
        from opforge.harness.candidate_process import setup
    elif role == "reference":
        from opforge.harness.reference_process import admit, setup

        if msg.get("op") == "admit":  # GPU memory for the whole evaluation, before its setup (reference_process)
            try:
                granted = admit(msg)
            except BaseException as exc:  # noqa: BLE001 - reported as the setup's failure
                traceback.print_exc()
                send(conn, {"ok": False, "status": "load_error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                return
            send(conn, {"ok": True, "gib": granted["gib"], "waited_s": granted["waited_s"]})
            try:
                msg, blob = recv(conn, allow_blob=True, max_bytes=1 << 31)
            except ProtocolError:
                return
    else:
        send(conn, {"ok": False, "error": f"unknown role {role!r}"})
        return
    try:
        server, reply, out_blob = setup(msg, blob)
    except BaseException as exc:  # noqa: BLE001 - reported as the setup's failure
        traceback.print_exc()
        status = "oom" if isinstance(exc, Exception) and is_oom(exc) else "load_error"
        send(conn, {"ok": False, "status": status, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        return
    send(conn, reply, out_blob)
    if server is None:
        return
    while True:
        try:
            msg, blob = recv(conn, allow_blob=True, max_bytes=1 << 31)
        except ProtocolError:
            return
        op = msg.get("op")
        out_blob = None
        try:
            if op == "call":
                server.before_call()
                reply = serve_call(server, msg)
            elif op == "slots":
                # new slots (an empty list releases the mapped ones): the graphs of the old ones go with them
                server.graphs.clear()
                server.graph_error.clear()
                server.slots = []
                server.slots = map_slots(msg["slots"], blob)
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            elif op == "exit":
                # the mapped slots are released before the reply: the grader's CUDA IPC blocks are freed only once
                # every process that mapped them has let go (harness.warm: a long-lived grader checks that)
                server.targets.clear()
                server.graphs.clear()
                server.slots = []
                gc.collect()
                send(conn, {"ok": True})
                return
            elif op in server.handlers:
                reply, out_blob = server.handlers[op](msg, blob)
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except BaseException as exc:  # noqa: BLE001 - a failed step is a reply, not a dead server
            traceback.print_exc()
            reply, out_blob = {"ok": False, "oom": isinstance(exc, Exception) and is_oom(exc),
                               "error": f"{type(exc).__name__}: {str(exc)[:500]}"}, None
        send(conn, reply, out_blob)


if __name__ == "__main__":
    main()
