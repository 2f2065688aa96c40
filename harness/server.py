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
        handlers: extra ``op`` -> handler(msg, blob) -> (reply, blob) (the reference's ``draw``).
        wake: one element on ``device``, filled before each burst (``serve_call``).
    """

    def __init__(self, device: str):
        self.device = device
        self.targets: dict[str, Callable[..., Any]] = {}
        self.slots: list[torch.Tensor] = []
        self.owned: dict[str, torch.Tensor] = {}
        self.after_call: Callable[[], dict[str, Any]] = dict
        self.handlers: dict[str, Callable] = {}
        self.wake = torch.zeros(1, device=device)


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
    device's current one, so the switch from the grader's L2 flush is not charged to the burst's first call."""
    fn = server.targets[msg["target"]]
    plans = [([server.slots[a["slot"]] if "slot" in a else a["value"] for a in c["inputs"]],
              [server.slots[i] for i in c["outputs"]]) for c in msg["calls"]]
    done: list[dict[str, Any]] = []
    if server.device == "cuda":
        with _disable_current_modes():
            server.wake.fill_(0)
            torch.cuda.synchronize()
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
    return {"ok": True, "hint_ms": hint_ms, "calls": done, **server.after_call()}


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
            send(conn, {"ok": True, "gib": granted["gib"]})
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
                reply = serve_call(server, msg)
            elif op == "slots":
                server.slots = map_slots(msg["slots"], blob)
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            elif op == "exit":
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
