"""The grader: verification and timing of one built candidate, decided in this process.

Two one-shot servers answer the grader (``engine.oneshot.ServerProcess``, ``engine.protocol``): the
*reference* server (the task's ``Model`` eager and ``torch.compile``; it never imports candidate code) and the
*candidate* server (``ModelNew``; it only receives inputs and returns outputs). The grader holds everything
the verdict depends on:

* Seeds: drawn per evaluation from ``secrets`` (weights and every input draw); the candidate never sees one.
* Inputs: drawn by the reference server in batches and kept here; before each candidate call one set is
  copied into one of ``input_sets`` rotating input slots, so every call gets fresh values and the slot
  addresses rotate. Each set reaches the reference's slots only after the candidate answered for it.
* Calls: one schedule of rounds - ``correct_trials`` verify rounds, ``warmup`` rounds, ``timing_trials``
  timed rounds, ``reverify_trials`` rounds - and every round is the same ``call`` message to the candidate,
  whose outputs are verified in every round (so timed calls are checked calls). Every round of the public
  shape is a *burst*: one message of ``burst`` back-to-back calls, each on a fresh input set in a slot set of
  its own (verify, warm-up and timed rounds look alike), answered after one device synchronisation (``engine.timing``: ``burst`` is sized by
  the reference from eager's time (on CUDA once both servers are set up and while this evaluation holds the
  device's timing lock exclusively), so a burst lasts about ``EvalConfig.burst_target_ms``, 1 ms by default, at
  most ``engine.timing.MAX_BURST`` calls and ``BURST_BYTES`` of sets), so the fixed cost of a request (the
  socket, the wake of a stopped process) is spread over the burst's calls. Output slots are poisoned
  (NaN / the integer minimum) before a call and copied right after the reply (an answer given before the
  work is done is caught by the comparison); inputs are compared byte for byte with the grader's copy after
  every call. On CUDA the grader zeroes a buffer twice the L2 size before each request (the method of
  ``triton.testing.do_bench``), outside the measured time: every call of a burst reads inputs from HBM, and
  weights that fit in L2 stay there after the burst's first call, on both sides of a speed-up.
* CUDA graphs (``EvalConfig.cuda_graphs``, CUDA only): each server captures every call of the public shape
  into a CUDA graph after its first plain run (``harness.server.serve_call``), the rounds rotate over the
  burst's captured sets (two when a burst is one call), and every later burst replays the graphs, so a call's
  time is its device work without the host's per-call cost. A target that cannot be captured turns graphs off
  for every target (flag ``cuda_graphs_off:<target>``); ``graphs`` in the result: every timed burst replayed.
  The reference sizes the burst from replays of eager.
* Hidden shape variants (``variants``: size-constant values per variant, ``compose.variants``): the reference
  draws their inputs from the task source with those values and runs the same ``Model`` on them. Their slots
  are allocated with the public ones (the candidate's setup lists every slot), their rounds are verify rounds
  (candidate, then eager; never timed) shuffled in secret order among the final re-verify rounds, and a call is
  the same ``call`` message whatever the shape. A wrong answer on one is ``incorrect``, its message naming the
  variant but not its shapes; a variant the reference cannot run is dropped (flag ``variant_skipped:<j>``).
* Time: per target, per call, ``max(median hint, low wall - overhead - slack)``, at most ``median wall``
  (``slack``: ``WALL_SLACK_MS`` per request, divided among its calls): ``wall`` is
  this process's ``time.perf_counter`` around each timed request divided by its burst's calls (the candidate
  cannot touch it), ``hint`` the server's own time of the burst (untrusted from the candidate) divided the same
  way, ``overhead`` the low quantile of ``wall - hint`` of the reference's eager calls: what the protocol and
  the server's own code cost per call, measured on a server that never ran candidate code; ``low`` is the
  ``WALL_QUANTILE`` quantile. Both servers run the same call code, so a candidate that under-reports its hint
  is still charged its wall time less the reference's overhead. Work a call leaves queued on any stream is
  charged: the server synchronises the whole device before it replies. The wall bound uses a low quantile
  on both sides because a request's wake-up and socket latency only ever add time: over 15 evaluations
  (alone, one H200) of an honest kernel of about 0.5 ms per call timed one call per request, its speed-up over
  eager spread 0.97-1.17 (sd 0.064) with a median-based bound, 1.05-1.17 (sd 0.031) with this one and
  1.08-1.17 (sd 0.028) from the hints alone (measured 2026-11-26, one H200; record in the
  git history of docs/benchmark-log.md). On CPU each request starts in a process that slept since its previous
  one (cold caches): a 64 x 256 elementwise task takes about 0.14 ms per call so timed one call per request
  against 0.01 ms in a hot loop, on both sides of the speed-up.
* Device: the timed rounds hold the device's timing lock exclusively (``engine.gpu_locks.GpuLock``:
  ``compute`` on the physical GPU, ``cpu.compute`` on CPU), consecutive rounds under one hold of at most
  ``TIMING_HOLD_S``; every other round holds it shared, so two evaluations never time at once and nothing
  else of theirs runs meanwhile. A timed call may take at most ``TIMED_CALL_FACTOR`` x the slowest untimed
  call of its kind (candidate, eager, compile; at least ``TIMED_CALL_FLOOR_S``), else the evaluation ends
  ``timeout``: a candidate that stalls only once timing starts cannot hold every other user of the device
  off for the whole evaluation timeout. An untimed candidate call (held shared, which an exclusive waiter
  queues behind) may take at most ``UNTIMED_CALL_FACTOR`` x the slowest eager call so far, at least
  ``UNTIMED_CALL_FLOOR_S``. Both bounds are per call: a burst of ``n`` calls may take ``n`` times as long.
* Quiet: between its calls the candidate's process group is stopped (``SIGSTOP`` / ``SIGCONT``), so
  no thread or child of it competes with the reference's timed calls. The reference server is stopped
  between its calls the same way, so both sides of a speed-up wake from the same state and ``overhead``
  (measured on the reference) includes the wake-up.
* Verdict: ``hacked`` for a guard violation, a changed setting, a replaced timing, synchronisation, event or
  statistics function (``timing:changed:``, from the candidate's snapshot of them, ``harness.timing_tamper``),
  an output that is not a plain strided tensor on the device or that aliases an input or weight, a modified
  input, or a malformed reply;
  ``incorrect`` for wrong values, count, shape or dtype, a failed call or a server that died; ``timeout``;
  ``oom``.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from opforge.engine.oneshot import ServerProcess
from opforge.engine.protocol import ProtocolError, pack_pair
from opforge.engine.timing import MAX_BURST
from opforge.harness import gpu_memory
from opforge.harness.slots import SlotSet, dtype_from

SERVER_MODULE = "opforge.harness.server"  # the model servers' entry point (``harness.server``)
# environment of both model servers. OpenMP threads sleep at once when idle instead of spinning: the eager
# model's ATen pool and the OpenMP pool of Inductor's compiled C++ kernel (a second runtime in the same
# process) otherwise spin against each other, and the CPU compile baseline of tests/harness_cases.py's task
# measured 3.5-4.0 ms instead of 0.1-0.3 ms in 2 of 5 evaluations on a 2-core machine (0 of 6 with PASSIVE;
# measured 2026-11-23, 2-core CPU; record in the git history of docs/benchmark-log.md)
SERVER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# what the model servers' fork server imports before it forks them (engine.forkserver): torch and torch._dynamo
# (the reference's FakeTensorMode and torch.compile need it) are about 4 s + 5 s of each server's start on an H200
# host, more when a batch's servers all start at once. Both roles share it: it holds nothing but imported code.
SERVER_PRELOAD = ("torch", "torch._dynamo", "opforge.harness.server", "opforge.harness.reference_process",
                  "opforge.harness.candidate_process")

# The quantile of the timed calls' walls (and of the reference's wall - hint) that bounds a time from below:
# low enough that the wake-up and socket delays, which only add, rarely reach it; high enough that one
# unusually fast call does not set it (2 of 20 timed rounds lie at or below it).
WALL_QUANTILE = 0.10
# What a request's wall time may exceed the reference's overhead by before the wall bounds a time (ms per request,
# divided among its calls): honest candidates' wall - hint exceeded the reference's by up to 0.24 ms per request
# on an H100, alone (benchmarks/results/h100/timing_floor.json, measured with a draft of this grader that copied
# the outputs after the burst, inside the wall but outside the hint), which with no slack moved an honest kernel's
# speed-up by up to 20 % between evaluations. A candidate that under-reports its own time still cannot hide more
# than this per request.
WALL_SLACK_MS = 0.25
# Consecutive timed rounds share one exclusive hold of the device while it has lasted less than this. Timed
# one round per hold, with other evaluations' rounds between them, an honest kernel of about 0.5 ms per call
# reported a median time 18 % longer in a batch of 16 than alone (eager's 10 %); within one hold, 5 % (eager's
# 1 %) (one H200, measured 2026-11-26; within one hold:
# benchmarks/results/h200/harness_consistency_scale_relu.json, one round per hold: record in the
# git history of docs/benchmark-log.md). A hold this short delays the device's other users (filter sandboxes,
# other evaluations) by about as much as one slow task's timing.
TIMING_HOLD_S = 1.0
# A timed call slower than this many times its kind's slowest untimed call (verification and warm-up calls
# on the same inputs' shapes, the device shared) is a stall, not noise; the floor covers sub-ms calls.
TIMED_CALL_FACTOR = 10.0
TIMED_CALL_FLOOR_S = 2.0
# An untimed candidate call may be far slower than eager (a naive but correct kernel still earns its
# correctness), but not without bound: the floor covers a first call's lazy CUDA / library start-up.
UNTIMED_CALL_FACTOR = 100.0
UNTIMED_CALL_FLOOR_S = 30.0


# (atol, rtol) of integer and bool outputs unless the config sets a tolerance: |out - ref| <= 0.5, so exact (a
# float tolerance with rtol 1e-2 would accept an index of 100,000 off by up to 1,000)
EXACT_TOLERANCE = (0.5, 0.0)


class _NotReusable(Exception):  # noqa: N818 - a kept reference server refused a setup (harness.warm)
    """A kept reference server cannot serve this evaluation's setup (``reusable: false``)."""


class Verdict(Exception):  # noqa: N818 - the end of an evaluation, carrying its status
    """Stops the schedule with ``status`` (and ``hacks`` or ``error``)."""

    def __init__(self, status: str, error: str | None = None, hacks: list[str] | None = None):
        super().__init__(error or status)
        self.status, self.error, self.hacks = status, error, hacks or []


def _reference_failed(reply: dict[str, Any], error: str) -> Verdict:
    """A failed reference step: ``oom`` when it ran out of device memory (on a shared GPU possibly the
    neighbours' doing; ``harness.batch`` runs it again alone), else ``load_error`` (the task is broken)."""
    oom = reply.get("oom") is True or reply.get("status") == "oom"
    return Verdict("oom" if oom else "load_error", error)


def _low(values: list[float]) -> float:
    """The ``WALL_QUANTILE`` quantile of ``values`` (linear interpolation; the value itself for one)."""
    if len(values) < 2:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(WALL_QUANTILE * 100) - 1]


def aggregate_timing(walls: dict[str, list[float]], hints: dict[str, list[float]], calls: int = 1
                     ) -> tuple[dict[str, dict[str, Any]], float]:
    """Per target (``eager``, ``candidate``, ``compile``) the time of its timed calls, from this process's
    wall ms and the servers' own (hint) ms of each call (see Time in the module docstring; both per call, each
    request a burst of ``calls`` calls): ``median_ms`` = ``max(median hint, low wall - overhead - slack)``, at
    most the median wall, where ``low`` is the ``WALL_QUANTILE`` quantile, ``overhead`` that quantile of eager's
    ``wall - hint`` and ``slack`` ``WALL_SLACK_MS / calls``; with the median
    and low walls, the median hint, the extremes, the trial count and every call's ms. Returns (timing,
    overhead ms). Raises ValueError without eager's walls (the overhead's reference), or when a target's walls
    and hints differ in length."""
    if not walls.get("eager"):
        raise ValueError("aggregate_timing: no timed eager calls, whose wall - hint is the overhead")
    for n in walls:
        if len(walls[n]) != len(hints.get(n, ())):
            raise ValueError(f"aggregate_timing: {n}: {len(walls[n])} walls, {len(hints.get(n, ()))} hints")
    med = statistics.median
    overhead = _low([w - h for w, h in zip(walls["eager"], hints["eager"], strict=True)])
    slack = WALL_SLACK_MS / max(int(calls), 1)
    timing = {}
    for n in walls:
        if not walls[n]:
            continue
        wall, hint, low = med(walls[n]), med(hints[n]), _low(walls[n])
        timing[n] = {"median_ms": min(max(hint, low - overhead - slack), wall), "trials": len(walls[n]),
                     "wall_median_ms": wall, "wall_low_ms": low, "hint_median_ms": hint,
                     "min_wall_ms": min(walls[n]), "max_wall_ms": max(walls[n]),
                     "walls_ms": [round(w, 4) for w in walls[n]], "hints_ms": [round(h, 4) for h in hints[n]]}
    return timing, overhead


def timing_lock(device: str):
    """A fresh ``GpuLock`` (own file handles, so evaluations in threads of one process exclude each other
    too) over this evaluation's device: ``compute`` of the physical GPU, or ``cpu``'s."""
    from opforge.engine.gpu_locks import GpuLock, physical_gpu

    return GpuLock(physical_gpu(0) if device == "cuda" else "cpu", "compute")


def default_threads() -> int:
    """Intra-op threads of both servers: the cores this process may run on."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# seconds a server may take to answer the teardown's last message (its slots released) before it is killed
GOODBYE_S = 5.0


def _goodbye(server: ServerProcess, msg: dict[str, Any]) -> dict[str, Any] | None:
    """Wake ``server`` and send it ``msg`` (the candidate's ``exit``, a kept reference's ``idle``); its reply when
    it answered ok within ``GOODBYE_S``, else None (a server that already exited or stalls)."""
    if server.proc.poll() is not None:
        return None
    server.resume()
    try:
        reply, _ = server.request(msg, GOODBYE_S)
    except ProtocolError:
        return None
    return reply if reply.get("ok") is True else None


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).min)


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


TIMING_TAMPERED = "the candidate replaced timing, synchronisation, event or statistics functions"


def _hint_hacks(reply: dict[str, Any]) -> list[str]:
    """Hack labels of a candidate reply's guard findings: ``torch_op:<op>`` for each dispatcher guard
    violation, ``timing:changed:<owner>.<name>`` for each watched timing function that is no longer the one
    the candidate's process started with (``harness.timing_tamper.TimingSnapshot``)."""
    return ([f"torch_op:{v}" for v in reply.get("violations") or []]
            + [f"timing:changed:{n}" for n in reply.get("timing") or []])


def _check_reply(reply: dict[str, Any], call: bool = True, calls: int = 1) -> None:
    """Raise ``Verdict("hacked", protocol:...)`` unless ``reply`` has the shape of a setup reply or of a call
    reply for a burst of ``calls`` calls."""
    def bad(what: str) -> Verdict:
        return Verdict("hacked", f"malformed reply: {what}", ["protocol:malformed"])

    def strings(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    if not isinstance(reply.get("ok"), bool):
        raise bad("no 'ok'")
    for key in ("violations", "config", "timing"):
        if not strings(reply.get(key, [])):
            raise bad(key)
    if reply["ok"] and call:
        hint = reply.get("hint_ms")
        if not isinstance(hint, (int, float)) or isinstance(hint, bool) or not math.isfinite(hint) or hint < 0:
            raise bad("hint_ms")
        done = reply.get("calls")
        if not isinstance(done, list) or len(done) != calls or not all(isinstance(c, dict) for c in done):
            raise bad("calls")
        for c in done:
            outs = c.get("outputs")
            if not isinstance(outs, list) or not all(isinstance(o, dict) for o in outs) \
                    or not isinstance(c.get("copied"), bool) or not strings(c.get("aliases", [])):
                raise bad("outputs")


class Grader:
    """One evaluation's schedule (see the module docstring). ``run()`` returns the ``EvalResult`` fields.

    Args:
        task: the dataset row (``task_id``, ``code``).
        model_new: the candidate's ``model_new.py`` source.
        module_path: the built extension (``.so``) or None.
        config: an ``EvalConfig``.
        work_dir: logs of both servers go here; the candidate server runs in ``work_dir/candidate``.
        alone: reserve the whole GPU (an ``oom`` re-run).
        warm: the warm servers of a long-lived grader process (``harness.warm.WarmServers``): the reference server
            comes from there when one with this setup is kept (``warm_reference`` then True) and goes back there
            when the evaluation ends without a fault of the reference's; the candidate server is its spare. None:
            both servers are started for this evaluation and closed after it.
    """

    # statuses after which the reference server did nothing wrong and may serve the next evaluation (harness.warm)
    KEEP_REFERENCE = ("correct", "incorrect", "hacked")

    def __init__(self, task: dict[str, Any], model_new: str, module_path: str | None, config, work_dir: Path,
                 alone: bool = False, variants: list[dict[str, int]] | None = None, warm=None):
        self.task, self.model_new, self.module_path = task, model_new, module_path
        self.warm = warm
        self.warm_reference = False
        self.variants = list(variants or [])
        self.cfg, self.work_dir, self.alone = config, Path(work_dir), alone
        self.device = config.device
        self.cuda = self.device == "cuda"
        self.threads = config.threads or default_threads()
        self.deadline = time.monotonic() + config.eval_timeout_s
        self.lock = timing_lock(self.device)
        self._startup = None
        self.logs: dict[str, str] = {}
        # seconds of the evaluation's steps (EvalResult.phases_s): admit (reference start and GPU memory
        # admission, CUDA; admit_wait: the part of it spent waiting for memory), setup (both servers ready), rounds
        # (from then to the verdict), draw (the reference's input draws, part of the rounds), compile (the first
        # burst of torch.compile's target: its compilation, part of the rounds), teardown (servers'
        # exits, slots freed), total
        self.phases: dict[str, float] = {}
        self._t_setup = 0.0  # perf_counter when the servers' setup began
        self._t_rounds = 0.0  # perf_counter when both servers were set up

    # -- plumbing ------------------------------------------------------------------------------------
    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Verdict("timeout", f"timeout: evaluation ran past {self.cfg.eval_timeout_s:g} s")
        return left

    def _ask(self, server: ServerProcess, msg: dict, blob: bytes | None = None,
             limit_s: float | None = None) -> tuple[dict, bytes | None, float]:
        """(reply, blob, wall ms). A dead, silent or garbled server becomes a ``Verdict``; so does a reply
        slower than ``limit_s`` seconds (a timed call, see ``TIMED_CALL_FACTOR``)."""
        t0 = time.perf_counter()
        left = self._left()
        try:
            reply, out = server.request(msg, left if limit_s is None else min(left, limit_s), blob)
        except ProtocolError as exc:
            text = str(exc)
            if "no reply within" in text and limit_s is not None and limit_s < left:
                raise Verdict("timeout", f"timeout: {msg.get('target', 'the')} call ran past its limit of "
                                         f"{limit_s:.3g} s (see harness.grader: TIMED_CALL_FACTOR, "
                                         "UNTIMED_CALL_FACTOR)") from None
            if "no reply within" in text:
                raise Verdict("timeout", f"timeout: {text}") from None
            if server.trusted:
                raise Verdict("load_error", f"{text}\n{server.log_tail()}") from None
            if "malformed" in text or "unexpected" in text:
                raise Verdict("hacked", text, ["protocol:malformed"]) from None
            raise Verdict("incorrect", f"{text}\n{server.log_tail(800)}") from None
        return reply, out, (time.perf_counter() - t0) * 1e3

    def _server(self, role: str) -> ServerProcess:
        """Start the ``role`` server (the reference in the work directory, the candidate in its own; with ``warm``,
        the reference in a folder of the warm servers' and the candidate is their spare)."""
        if self.warm is not None:
            return self.warm.new_server(role) if role == "reference" else self.warm.take_candidate()
        if role == "reference":
            return ServerProcess(SERVER_MODULE, role, self.work_dir, self.work_dir / "reference.log", env=SERVER_ENV,
                                 trusted=True, preload=SERVER_PRELOAD)
        return ServerProcess(SERVER_MODULE, role, self.work_dir / role, self.work_dir / f"{role}.log", env=SERVER_ENV,
                             preload=SERVER_PRELOAD)

    def _admit(self, ref: ServerProcess) -> None:
        """The reference server's ``admit`` step (``harness.reference_process.admit``); waits as long as the
        evaluation's time allows."""
        reply, _, _ = self._ask(ref, {"op": "admit", **self._admission()})
        if not reply.get("ok"):
            raise Verdict("load_error", f"reference admission: {reply.get('error')}\n{ref.log_tail()}")
        self.phases["admit_wait"] = float(reply.get("waited_s") or 0.0)

    def _setup_message(self) -> dict[str, Any]:
        """The reference's ``setup`` message, with a fresh secret seed."""
        return {"op": "setup", **self._admission(), "seed": secrets.randbits(62), "device": self.device,
                "threads": self.threads, "allow_tf32": self.cfg.allow_tf32}

    def _warm_reference(self) -> ServerProcess | None:
        """A kept reference server of this evaluation's setup (``harness.warm``), on CUDA with the evaluation's
        GPU memory admitted again (waiting, as ``_admit``); None when there is none, this is an ``alone`` re-run,
        or the kept server does not answer (it is closed; the caller starts a fresh one). Its ``setup`` (a fresh
        seed) is ``_schedule``'s, as for a fresh server."""
        if self.warm is None or self.alone:
            return None
        ref = self.warm.take_reference(self._ref_key())
        if ref is None:
            return None
        try:
            info = self._ask(ref, {"op": "admit"})[0] if self.cuda else {"ok": True}
        except Verdict:
            info = {"ok": False}
        if not info.get("ok"):
            self.warm.discard(ref)
            return None
        self.warm_reference = True
        return ref

    def _admission(self) -> dict[str, Any]:
        """What the reference needs to size the evaluation's GPU reservation (its ``admit`` and ``setup``)."""
        cfg = self.cfg
        return {"task_code": self.task["code"], "task_id": str(self.task["task_id"]),
                "gpu_memory_fraction": cfg.gpu_memory_fraction, "gpu_admit_gib": cfg.gpu_admit_gib,
                "alone": self.alone, "variants": self.variants, "input_sets": max(2, cfg.input_sets),
                "cuda_graphs": self.cuda and cfg.cuda_graphs,
                "burst_target_ms": cfg.burst_target_ms, "burst_calls": cfg.burst_calls}

    def _end_startup(self) -> None:
        if self._startup is not None:
            self._startup.__exit__(None, None, None)
            self._startup = None

    def _flush(self) -> torch.Tensor:
        if not hasattr(self, "_l2"):
            from opforge.engine.timing import l2_flush_buffer

            self._l2 = l2_flush_buffer(torch.device(self.device))
        return self._l2

    # -- the evaluation ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hacks": [], "flags": []}
        ref = cand = None
        slots: list[SlotSet] = []
        t0 = time.perf_counter()
        try:
            if self.cuda:
                # the candidate's server starts beside the reference's, so its import of torch overlaps the
                # reference's start and the wait for GPU memory instead of following them (it touches the GPU only
                # at its setup, after the admission; with ``warm``, a spare started earlier is taken below)
                if self.warm is None:
                    cand = self._server("candidate")
                # GPU memory for the whole evaluation, admitted before this evaluation holds the device's lock:
                # one waiting for memory must not hold up, even shared, one that holds memory and waits to time (a
                # kept reference server is admitted again the same way)
                ref = self._warm_reference() or self._fresh_reference()
                self.phases["admit"] = time.perf_counter() - t0
            # the servers' start (imports of torch) is CPU work a neighbour's timing must not share: the lock
            # is held shared from here until both are set up (on CUDA both servers' imports began before)
            self._t_setup = time.perf_counter()
            self._startup = self.lock.shared()
            self._startup.__enter__()
            ref = ref or self._warm_reference() or self._server("reference")
            cand = cand or self._server("candidate")
            self.logs = {"reference": str(ref.log), "candidate": str(cand.log)}
            try:
                out.update(self._schedule(ref, cand, slots))
            except _NotReusable:  # the kept reference cannot serve this setup: a fresh one, admitted out of the lock
                self.warm.discard(ref)
                self.warm_reference = False
                self._end_startup()
                ref = self._fresh_reference() if self.cuda else None
                self._startup = self.lock.shared()
                self._startup.__enter__()
                ref = ref or self._server("reference")
                self.logs["reference"] = str(ref.log)
                out.update(self._schedule(ref, cand, slots))
            out["status"] = "correct"
        except Verdict as v:
            out.update(status=v.status, error=v.error, hacks=[*out["hacks"], *v.hacks])
        except torch.OutOfMemoryError as exc:  # this process's slots or copies: the neighbours' memory, or its own
            out.update(status="oom", error=f"grader: {str(exc)[:300]}")
        finally:
            t_end = time.perf_counter()
            if self._t_rounds:
                self.phases["rounds"] = t_end - self._t_rounds
            self._end_startup()
            # the teardown (servers' exits, their CUDA contexts, the slots' unmapping and freeing) is work on
            # the device and its host a neighbour's timed round must not share: held shared, like the start
            keep = (self.warm is not None and not self.alone and out.get("status") in self.KEEP_REFERENCE
                    and not any(f.startswith("variant_skipped") for f in out.get("flags") or []))
            with self.lock.shared():
                self._teardown(ref, cand, slots, keep)
            self.lock.close()
            self.phases["teardown"] = time.perf_counter() - t_end
        self.phases["total"] = time.perf_counter() - t0
        out["warm_reference"] = self.warm_reference
        out["logs"] = self.logs
        out["phases_s"] = {k: round(v, 3) for k, v in self.phases.items()}
        return out

    def _teardown(self, ref: ServerProcess | None, cand: ServerProcess | None, slots: list[SlotSet],
                  keep: bool = False) -> None:
        """The servers' exits and the slots' release. The reference server holds the evaluation's GPU
        reservation (``harness.gpu_memory``): it exits last, after the candidate has unmapped the slots and
        this process has freed them and emptied its cache. With ``warm``, the candidate is first asked to let go
        of its slots (so this long-lived process can free them, ``harness.warm``), and with ``keep`` the reference
        releases its slots and goes back to the warm servers instead of exiting."""
        if cand is not None:
            if self.warm is not None:
                _goodbye(cand, {"op": "exit"})
                self.warm.discard(cand)
            else:
                cand.close()
        idle = None
        if ref is not None and self.warm is not None:  # kept: idle; else its slots let go before they are freed
            idle = _goodbye(ref, {"op": "idle"} if keep else {"op": "slots", "slots": []})
            idle = idle if keep else None
        for s in slots:
            s.close()
        slots.clear()
        if self.cuda:
            self.__dict__.pop("_l2", None)
            torch.cuda.empty_cache()
            if self.warm is not None:
                torch.cuda.ipc_collect()
        if ref is not None:
            if idle is not None:
                self.warm.keep_reference(self._ref_key(), ref, idle)
            elif self.warm is not None:
                self.warm.discard(ref)
            else:
                ref.close()

    def _ref_key(self) -> str:
        """The key of this evaluation's reference setup among the warm servers (``harness.warm.reference_key``)."""
        from opforge.harness.warm import reference_key

        return reference_key(self._setup_message())

    def _fresh_reference(self) -> ServerProcess:
        """A new reference server, admitted (CUDA)."""
        ref = self._server("reference")
        self._admit(ref)
        return ref

    def _schedule(self, ref: ServerProcess, cand: ServerProcess, slot_sets: list[SlotSet]) -> dict[str, Any]:
        cfg = self.cfg
        common = {"device": self.device, "threads": self.threads, "allow_tf32": cfg.allow_tf32}
        with self.lock.shared():
            info, payload, _ = self._ask(ref, self._setup_message())
        if not info.get("ok"):
            if self.warm_reference and info.get("reusable") is False:
                raise _NotReusable()
            raise _reference_failed(info, f"reference: {info.get('error')}\n{ref.log_tail()}")
        result: dict[str, Any] = {"precision": info.get("config", {})}
        layout, out_layout = info["inputs"], info["outputs"]
        k = max(2, cfg.input_sets)
        # each call of a burst has a slot set of its own: on CUDA, sets for the longest burst the reference may ask
        # for (engine.timing.burst_cap), the calls per burst sized once both servers are set up (below); on CPU
        # the reference sized the burst during its setup. With CUDA graphs only the sets the rounds rotate over
        # (``rotate`` below) are allocated: gpu_memory.slot_sets
        most = max(1, min(int(info.get("burst") or 1), MAX_BURST))
        # the candidate's set in a memory pool of its own: CUDA IPC maps whole segments (harness.slots)
        cset, rset = SlotSet(self.device, private=True), SlotSet(self.device)
        slot_sets += [cset, rset]
        # hidden shape variants the reference could run; each gets two rotating slot sets of its own, allocated
        # with the public ones, so the candidate's setup and call messages look alike for every shape
        shapes = {None: (layout, out_layout, gpu_memory.slot_sets(k, most, self.cuda and cfg.cuda_graphs))}
        for j, v in enumerate(info.get("variants") or []):
            if "error" in v:
                result.setdefault("flags", []).append(f"variant_skipped:{j}")
            else:
                shapes[j] = (v["inputs"], v["outputs"], 2)

        def allocate(sset: SlotSet) -> dict:
            out = {}
            for key, (lay, olay, n) in shapes.items():
                ins = [[sset.new(a["shape"], dtype_from(a["dtype"]))[0] for a in lay if a["tensor"]] for _ in range(n)]
                outs = [[sset.new(o["shape"], dtype_from(o["dtype"]))[0] for o in olay] for _ in range(n)]
                out[key] = (ins, outs)
            return out

        c_slots, r_slots = allocate(cset), allocate(rset)
        # the reference draws each shape's input sets straight into slots of its own set (device to device):
        # the grader copies them into both servers' input slots, and nothing drawn crosses the socket
        d_slots = {key: [[rset.new(a["shape"], dtype_from(a["dtype"]))[0] for a in lay if a["tensor"]]
                         for _ in range(n)] for key, (lay, _olay, n) in shapes.items()}
        c_in, c_out = c_slots[None]
        r_in, r_out = r_slots[None]
        with self.lock.shared():
            reply, _, _ = self._ask(ref, {"op": "slots", "slots": [s.as_dict() for s in rset.specs]}, rset.ipc_blob())
            if reply.get("ok") is not True:
                raise _reference_failed(reply, f"reference slots: {reply.get('error')}")
            reply, _, _ = self._ask(cand, {"op": "setup", "model_new": self.model_new, "module_path": self.module_path,
                                           "namespaces": list(cfg.namespaces), "seed": secrets.randbits(62),
                                           "slots": [s.as_dict() for s in cset.specs], **common},
                                    pack_pair(payload or b"", cset.ipc_blob()))
            _check_reply(reply, call=False)
            if reply.get("violations") or reply.get("timing"):
                raise Verdict("hacked", reply.get("error") or TIMING_TAMPERED, _hint_hacks(reply))
            if not reply["ok"]:
                status = reply.get("status") if reply.get("status") in ("load_error", "oom") else "load_error"
                raise Verdict(status, reply.get("error"))
        result["weights_missing"] = reply.get("weights_missing")
        self._end_startup()
        self._t_rounds = time.perf_counter()
        self.phases["setup"] = self._t_rounds - self._t_setup
        # calls per warm-up and timed burst (engine.timing.burst_size), sized by the reference from eager's time
        # while this evaluation holds the device alone: a neighbour's work would make eager look slower and the
        # bursts too short (in batches of 16 on one H100, most evaluations of a 0.06 ms task got one call per
        # burst when the reference sized it during its setup)
        n_burst = most
        # CUDA graphs for the public shape's bursts (EvalConfig.cuda_graphs): on until a target cannot be captured
        graphs = {"on": self.cuda and cfg.cuda_graphs, "error": None, "replayed": 0, "plain": 0}
        if self.cuda and most > 1:
            with self.lock.exclusive():
                ref.resume()
                size, _, _ = self._ask(ref, {"op": "size", "graph": graphs["on"]})
                ref.pause()
            if size.get("ok") is not True:
                raise _reference_failed(size, f"reference burst size: {size.get('error')}")
            n_burst = max(1, min(int(size.get("burst") or 1), most))
        result["burst"] = n_burst

        # the final check: the re-verify rounds and each variant's rounds, in a secret random order
        final: list[Any] = ["reverify"] * cfg.reverify_trials + [j for j in shapes if j is not None
                                                                  for _ in range(cfg.variant_trials)]
        secrets.SystemRandom().shuffle(final)
        phases = (["verify"] * cfg.correct_trials + ["warmup"] * cfg.warmup + ["timing"] * cfg.timing_trials
                  + final)
        pending: dict[Any, list[tuple[list[Any], list[dict]]]] = {key: [] for key in shapes}
        names = ["eager", "candidate"] + (["compile"] if cfg.profile_compile else [])
        walls: dict[str, list[float]] = {n: [] for n in names}
        hints: dict[str, list[float]] = {n: [] for n in names}
        worst = 0.0
        t_verify = t_profile = 0.0

        def next_inputs(variant: int | None = None) -> tuple[list[Any], list[dict]]:
            queue = pending[variant]
            if not queue:
                want, n = shapes[variant][0], shapes[variant][2]
                targets = d_slots[variant]
                msg = {"op": "draw", "seeds": [secrets.randbits(62) for _ in range(n)], "slots": targets}
                if variant is not None:
                    msg["variant"] = variant
                t0 = time.perf_counter()
                with self.lock.shared():
                    ref.resume()
                    reply, _, _ = self._ask(ref, msg)
                self.phases["draw"] = self.phases.get("draw", 0.0) + time.perf_counter() - t0
                if not reply.get("ok"):
                    raise _reference_failed(reply, f"reference draw: {reply.get('error')}")
                layouts = reply.get("layouts") or []
                if len(layouts) != n or any([(a["tensor"], a.get("shape"), a.get("dtype")) for a in lay] !=
                                            [(a["tensor"], a.get("shape"), a.get("dtype")) for a in want]
                                            for lay in layouts) or reply.get("copied") is not True:
                    raise Verdict("load_error", "the task's get_inputs() changes shapes or dtypes between draws")
                for idx, lay in zip(targets, layouts, strict=True):
                    tensors = iter(idx)
                    queue.append(([rset.tensors[next(tensors)] if a["tensor"] else a["value"] for a in lay], lay))
            return queue.pop(0)

        slowest: dict[str, float] = {}  # target -> slowest untimed call, ms

        def call(server: ServerProcess, target: str, slots: list[int], ins: list[list[int]], outs: list[list[int]],
                 sset: SlotSet, draws: list[tuple[list[Any], list[dict]]], olay: list[dict] = out_layout,
                 public: bool = True) -> tuple[dict, float, list[list[torch.Tensor]]]:
            """One ``call`` message: a burst of ``len(slots)`` calls, call ``j`` on input set ``draws[j]``
            copied into slot set ``slots[j]``; asking for CUDA-graph replays while ``graphs["on"]`` and
            ``public`` (the public shape). Returns (reply, wall ms of the burst, each call's outputs)."""
            timed = self.lock.mode == "exclusive"
            n = len(slots)
            if timed:
                limit = max(TIMED_CALL_FLOOR_S, TIMED_CALL_FACTOR * n * slowest.get(target, 0.0) / 1e3)
            elif server is cand:
                limit = max(UNTIMED_CALL_FLOOR_S, UNTIMED_CALL_FACTOR * n * slowest.get("eager", 0.0) / 1e3)
            else:
                limit = None
            plan, written = [], []
            for slot, (values, lay) in zip(slots, draws, strict=True):
                tensors = iter(ins[slot])
                args = []
                for a, v in zip(lay, values, strict=True):
                    if a["tensor"]:
                        i = next(tensors)
                        sset.tensors[i].copy_(v)
                        args.append({"slot": i})
                        written.append((sset.tensors[i], v, len(args) - 1))
                    else:
                        args.append({"value": a["value"]})
                for i in outs[slot]:
                    _poison(sset.tensors[i])
                plan.append({"inputs": args, "outputs": outs[slot]})
            if self.cuda:
                self._flush().zero_()  # L2 is device-wide: the burst starts cold whichever process makes it
                torch.cuda.synchronize()
            # both servers sleep stopped between their calls and wake the same way for each (see Quiet)
            server.resume()
            graph = bool(public and graphs["on"])
            reply, _, wall = self._ask(server, {"op": "call", "target": target, "calls": plan,
                                                **({"graph": True} if graph else {})}, limit_s=limit)
            if not timed:
                slowest[target] = max(slowest.get(target, 0.0), wall / n)
            server.pause()
            if graph and reply.get("graph_error") and graphs["on"]:
                # one target that cannot be captured turns graphs off for all: both sides of a speed-up are
                # timed the same way
                graphs.update(on=False, error=f"{target}: {str(reply['graph_error'])[:300]}")
            if timed and public:
                graphs["replayed" if reply.get("graphed") is True else "plain"] += 1
            got = [[sset.tensors[i].clone() for i in outs[slot]] for slot in slots]
            if self.cuda:
                torch.cuda.synchronize()
            if server is cand:
                self._judge(reply, got, olay)
                changed = sorted({f"input{m}" for t, v, m in written if not _bytes_equal(t, v)})
                if changed:
                    raise Verdict("hacked", "the candidate modified its inputs",
                                  [f"input_modified:{c}" for c in changed])
            elif not reply.get("ok") or not all(c.get("copied") for c in reply.get("calls") or [{}]):
                raise _reference_failed(reply, f"reference {target} call failed: "
                                               f"{reply.get('error') or reply.get('calls')}")
            return reply, wall, got

        variant_rounds: dict[int, int] = {}
        n_sets = shapes[None][2]

        # with CUDA graphs, rounds rotate over the sets the first rounds capture: the burst's own n_burst sets (two
        # when a burst is one call), so every timed burst replays graphs made in the untimed rounds before it
        rotate = min(n_sets, max(n_burst, 2)) if graphs["on"] else n_sets

        def burst(i: int) -> list[int]:
            """The slot sets of round ``i``'s burst: ``n_burst`` distinct ones, the first moving each round."""
            return [(i + j) % rotate for j in range(n_burst)]

        i = 0
        while i < len(phases):
            phase = phases[i]
            if phase == "timing":
                # consecutive timed rounds under one exclusive hold of at most TIMING_HOLD_S (each call bounded):
                # the device's other users (filter sandboxes, other evaluations) run between holds, and no
                # candidate holds them off for long
                t0 = time.perf_counter()
                with self.lock.exclusive():
                    held = time.perf_counter()
                    while True:
                        worst = max(worst, self._round(call, next_inputs, burst(i), c_in, c_out, r_in, r_out,
                                                       cset, rset, cand, ref, walls, hints, True))
                        i += 1
                        if (i == len(phases) or phases[i] != "timing"
                                or time.perf_counter() - held >= TIMING_HOLD_S):
                            break
                t_profile += time.perf_counter() - t0
                continue
            t0 = time.perf_counter()
            if isinstance(phase, int):  # a hidden shape variant
                with self.lock.shared():
                    worst = max(worst, self._variant_round(call, next_inputs, phase, variant_rounds, c_slots,
                                                           r_slots, shapes, cset, rset, cand, ref))
                variant_rounds[phase] = variant_rounds.get(phase, 0) + 1
                t_verify += time.perf_counter() - t0
                i += 1
                continue
            with self.lock.shared():
                worst = max(worst, self._round(call, next_inputs, burst(i), c_in, c_out, r_in, r_out, cset, rset,
                                               cand, ref, walls, hints, phase == "warmup"))
            if phase == "warmup":
                t_profile += time.perf_counter() - t0
            else:
                t_verify += time.perf_counter() - t0
            i += 1
        cand.resume()
        ref.resume()
        try:
            if self.warm is None:  # a warm reference releases its slots in the teardown instead
                ref.request({"op": "exit"}, 5.0)
            cand.request({"op": "exit"}, 5.0)
        except ProtocolError:
            pass
        timing, overhead = aggregate_timing(walls, hints, n_burst)
        result["graphs"] = graphs["replayed"] > 0 and graphs["plain"] == 0
        if graphs["error"]:  # the target that could not be captured; its error is in its server's log
            result.setdefault("flags", []).append(f"cuda_graphs_off:{graphs['error'].split(':')[0]}")
        result.update(max_error=worst, verify_s=t_verify, profile_s=t_profile, timing=timing,
                      overhead_ms=overhead, variants_checked=len(variant_rounds))
        return result

    def _variant_round(self, call, next_inputs, j: int, done: dict[int, int], c_slots, r_slots, shapes, cset, rset,
                       cand, ref) -> float:
        """One verify round of hidden shape variant ``j`` (candidate, then eager; one call each, no timing). A
        wrong answer is ``incorrect`` with a message that names the variant but none of its shapes."""
        olay = shapes[j][1]
        slot = done.get(j, 0) % shapes[j][2]
        draws = [next_inputs(j)]
        (c_in, c_out), (r_in, r_out) = c_slots[j], r_slots[j]
        try:
            _, _, got = call(cand, "candidate", [slot], c_in, c_out, cset, draws, olay, public=False)
            _, _, expected = call(ref, "eager", [slot], r_in, r_out, rset, draws, olay, public=False)
            return self._compare(expected[0], got[0])
        except Verdict as v:
            if v.status == "incorrect":
                import re

                hidden = re.sub(r"\[[0-9, ]*\]", "[...]", v.error or "")
                raise Verdict("incorrect", f"hidden shape variant {j + 1}: {hidden}") from None
            raise

    def _round(self, call, next_inputs, slots: list[int], c_in, c_out, r_in, r_out, cset, rset, cand, ref, walls,
               hints, with_compile: bool) -> float:
        """One round on ``len(slots)`` fresh input sets: the candidate's burst, then eager's (the expected
        outputs), then ``torch.compile``'s when warming up or timing; in the timing phase (the lock held
        exclusively) appends each target's wall and hint ms per call (the burst's divided by its calls).
        Returns the round's error."""
        draws = [next_inputs() for _ in slots]
        timed = self.lock.mode == "exclusive"
        c_reply, c_wall, got = call(cand, "candidate", slots, c_in, c_out, cset, draws)
        e_reply, e_wall, expected = call(ref, "eager", slots, r_in, r_out, rset, draws)
        replies = {"candidate": (c_reply, c_wall), "eager": (e_reply, e_wall)}
        if with_compile and "compile" in walls:
            replies["compile"] = call(ref, "compile", slots, r_in, r_out, rset, draws)[:2]
            # the first compiled call is torch.compile's compilation (phases_s["compile"], part of the rounds)
            self.phases.setdefault("compile", replies["compile"][1] / 1e3)
        if timed:
            for name, (reply, wall) in replies.items():
                walls[name].append(wall / len(slots))
                hints[name].append(float(reply["hint_ms"]) / len(slots))
        return max(self._compare(e, g) for e, g in zip(expected, got, strict=True))

    def _compare(self, expected: list[torch.Tensor], got: list[torch.Tensor]) -> float:
        from opforge.engine.execution import tolerance_error

        worst = 0.0
        for n, (e, g) in enumerate(zip(expected, got, strict=True)):
            atol, rtol = self.cfg.atol, self.cfg.rtol
            if atol is None and rtol is None and not (e.is_floating_point() or e.is_complex()):
                atol, rtol = EXACT_TOLERANCE  # integer / bool outputs (indices, masks, counts): exact
            err = tolerance_error(e, g, atol, rtol)
            worst = max(worst, err)
            if not err <= 1.0:
                raise Verdict("incorrect", f"output {n} differs from the reference (max error {err:.3g} x "
                                           "tolerance) on fresh inputs")
        return worst

    def _judge(self, reply: dict[str, Any], got: list[list[torch.Tensor]], out_layout: list[dict]) -> None:
        """The candidate's reply to a burst of ``len(got)`` calls against the rules; raises ``Verdict`` on any
        break."""
        _check_reply(reply, calls=len(got))
        if reply.get("violations") or reply.get("timing"):
            raise Verdict("hacked", reply.get("error") or TIMING_TAMPERED, _hint_hacks(reply))
        if reply.get("config"):
            raise Verdict("hacked", "the candidate changed runtime settings", [f"config:{c}" for c in reply["config"]])
        if not reply["ok"]:
            raise Verdict("oom" if reply.get("oom") else "incorrect", reply.get("error") or "the call failed")
        for done in reply["calls"]:
            self._judge_call(done, out_layout)

    def _judge_call(self, done: dict[str, Any], out_layout: list[dict]) -> None:
        """One call of a burst: its outputs' aliases, class, layout, device, count, shapes, dtypes, delivery."""
        if done.get("aliases"):
            raise Verdict("hacked", "an output shares memory with an input or a weight",
                          [f"alias:{a}" for a in done["aliases"]])
        meta = done["outputs"]
        for n, m in enumerate(meta):
            if m.get("plain") is not True or m.get("strided") is not True:
                raise Verdict("hacked", f"output {n} is not a plain strided torch.Tensor", ["output:not_plain"])
            if m.get("device") != self.device:
                raise Verdict("incorrect", f"output {n} is on {m.get('device')}, expected {self.device}")
        if len(meta) != len(out_layout):
            raise Verdict("incorrect", f"{len(meta)} outputs, expected {len(out_layout)}")
        for n, (m, want) in enumerate(zip(meta, out_layout, strict=True)):
            if m.get("shape") != want["shape"]:
                raise Verdict("incorrect", f"output {n} has shape {m.get('shape')}, expected {want['shape']}")
            if m.get("dtype") != want["dtype"]:
                raise Verdict("incorrect", f"output {n} has dtype {m.get('dtype')}, expected {want['dtype']}")
        if not done["copied"]:
            raise Verdict("incorrect", "the outputs were not delivered")
