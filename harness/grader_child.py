"""The grader in a process of its own (``harness.evaluate`` uses it on CUDA), in one of two modes:

* ``python -m opforge.harness.grader_child grade REQUEST RESULT``: one evaluation, then exit
  (``engine.oneshot.run_child``; the default).
* ``python -m opforge.harness.grader_child serve FD``: a long-lived grader (``harness.grader_service``, with
  ``OPFORGE_WARM_GRADER=1``) that grades
  one request after another on the socket ``FD`` (``engine.protocol``) and keeps warm model servers between them
  (``harness.warm.WarmServers``). After each reply on CUDA it starts the next evaluation's spare candidate server
  (under the device's timing lock, held shared until the spare is ready). Before an ``alone`` evaluation it closes
  its kept references. It exits
  when asked (``exit``), when the socket closes, after ``IDLE_S`` without a request (its kept servers, and their
  GPU memory, go with it), and after an evaluation that left GPU memory of its own allocated (below); its reply
  then says ``retire``.

The grader allocates the input and output slots both model servers map through CUDA IPC. In a process shared with
other evaluations at once (a Dask worker) those allocations would share the caching allocator's segments with
other evaluations' slots; here one evaluation runs at a time, and at its end every slot, copy and flush buffer is
freed, the servers have let go of their mappings (the candidate's process is killed) and the cache is emptied.
A block a server never let go of (a killed candidate that still mapped it) cannot be freed and would stay
allocated for the process's life: the serving mode checks that the process's allocated GPU memory is back to what
it was before the evaluation, and retires the process otherwise. This process never imports candidate code.

REQUEST (JSON; in ``serve`` mode the message's fields): ``task`` (``task_id``, ``code``), ``model_new``,
``module_path``, ``config`` (an ``EvalConfig`` as JSON), ``work_dir``, ``alone``, ``variants``. RESULT: ``Grader.run``'s
fields and ``"ok": true``. A parent that has to kill this process kills its servers with it
(``engine.oneshot.kill_tree``, from the process table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# seconds a serving grader waits for its next request before it exits (harness.grader_service restarts it
# sooner than this: it never sends a request to a process about to leave)
IDLE_S = 120.0
# what the grader processes' fork server imports before it forks them (engine.forkserver; the grader's start was
# 3-4 s of each evaluation on an H200 host)
PRELOAD = ("torch", "opforge.harness.grader_child", "opforge.harness.grader", "opforge.harness.evaluate")


def grade(req: dict[str, Any], warm=None) -> dict[str, Any]:
    """One evaluation of ``req`` (see the module docstring) by ``harness.grader.Grader``; JSON-able."""
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.grader import Grader

    config = EvalConfig.model_validate(req["config"])
    out = Grader(req["task"], req["model_new"], req["module_path"], config, Path(req["work_dir"]),
                 alone=bool(req["alone"]), variants=req["variants"], warm=warm).run()
    out["ok"] = True
    return json.loads(json.dumps(out, default=str))


def _allocated() -> int:
    """Bytes of GPU memory this process's caching allocator has allocated, less the L2 flush buffer that
    ``engine.timing`` keeps for the process's life (0 without CUDA)."""
    import torch
    from opforge.engine.timing import flush_buffer_bytes

    if not torch.cuda.is_initialized():
        return 0
    return torch.cuda.memory_allocated() - flush_buffer_bytes()


def _blocks() -> str:
    """The caching allocator's active blocks, segments and reserved bytes, for the log line of an evaluation."""
    import torch

    if not torch.cuda.is_initialized():
        return "no CUDA"
    st = torch.cuda.memory_stats()
    return (f"active blocks {st.get('active.all.current')}, segments {st.get('segment.all.current')}, "
            f"reserved {torch.cuda.memory_reserved()}")


def serve(fd: int) -> None:
    """The ``serve`` mode's loop (see the module docstring)."""
    from multiprocessing.connection import Connection

    from opforge.engine.protocol import ProtocolError, recv, send
    from opforge.harness.warm import WarmServers

    conn = Connection(fd)
    warm = WarmServers()
    try:
        while True:
            try:
                msg, _ = recv(conn, IDLE_S, max_bytes=1 << 30)
            except ProtocolError:  # idle too long, or the parent closed the socket
                return
            if msg.get("op") != "grade":
                send(conn, {"ok": True})
                return
            before = _allocated()
            if msg.get("alone"):  # the whole GPU: the kept references' reservations go back first
                warm.close_references()
            try:
                out = grade(msg, warm)
            except Exception as exc:  # noqa: BLE001 - a fault of the grader's own: reported, then this process ends
                import traceback

                traceback.print_exc()
                send(conn, {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                return
            left = _allocated() - before
            print(f"graded {msg['task'].get('task_id')}: {out.get('status')}, warm reference "
                  f"{out.get('warm_reference')}, {len(warm.references)} kept ({warm.reused} reused so far; "
                  f"{warm.refused}), {left} bytes left allocated ({_blocks()})", file=sys.stderr, flush=True)
            if left > 0:
                out["retire"] = f"{left} bytes of GPU memory still allocated after the evaluation"
            send(conn, out)
            if left > 0:
                return
            if msg["config"].get("device") == "cuda":  # on CPU a spare would add little: the start is under the lock
                from opforge.harness.grader import timing_lock

                lock = timing_lock("cuda")
                try:
                    warm.prestart_candidate(lock)
                finally:
                    lock.close()
    finally:
        warm.close()


def main() -> None:
    if sys.argv[1] == "serve":
        return serve(int(sys.argv[2]))
    _step, request_path, result_path = sys.argv[1:4]
    out = grade(json.loads(Path(request_path).read_text()))
    Path(result_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
