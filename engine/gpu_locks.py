"""Cross-process reader/writer locks over one physical GPU, for the sandboxes that share it.

Several sandbox children run tasks on one GPU at once, so that one task's compilation (CPU) overlaps
another's GPU work. Two locks per physical GPU coordinate them:

* ``compute``: every stretch of a task's GPU work (building the model, forward calls, output comparisons)
  holds it *shared*; timing holds it *exclusively*. Without MPS a GPU time-slices between processes, so a
  neighbour's kernel running during a timed call would land inside the CUDA-event window and inflate the
  measurement; with the lock, a timed call has the GPU to itself. Holds are kept to GPU work: Inductor's
  compilation (CPU) runs unlocked (``filters.torch_compile``), so timing never waits for a compile.

Memory is shared by admission instead (``MemoryBudget``): a task reserves GiB before it starts, grows its
reservation to what it measured after each filter, and new tasks wait until theirs fits next to the
others'; a task that ran out of memory next to the others is re-run reserving the whole GPU (no other
task's tensors on it), so an ``oom`` verdict means the task does not fit alone.

Implementation: ``flock`` on ``$TMPDIR/opforge-gpu-<gpu>.<name>`` (shared / exclusive) behind a turnstile
file ``.<name>.turnstile``: an exclusive holder takes the turnstile before waiting, so a stream of shared
holders cannot starve it. It holds the turnstile for at most ``GpuLock.DRAIN_S`` while the shared holders
drain; when one of them is still in a long step (a forward call of seconds, slowed further by the GPU's
time-slicing), it lets the turnstile go, backs off and tries again, so one long step holds up the one
task that wants to time, not every sandbox on the GPU (a 60 s stall of a whole GPU was measured without
this). Exclusive holders queue as a batch: from the moment one wants the lock until it lets it go (back-offs
excepted) it holds a third file, ``.<name>.writers``, shared, and a new shared holder first waits, at most
``GpuLock.GATE_S``, until no one holds that file. So when one timing ends and another sandbox is already
waiting to time, the second one goes next, without first draining shared steps that slipped in between
(each drain idles part of the GPU; on an H200 with 14 sandboxes a timing started every ~0.3 s).
Per process the state is re-entrant: ``shared`` inside ``shared`` or
``exclusive`` is a no-op, ``exclusive`` inside ``shared`` gives up the shared hold first (and takes it back
after), so two holders upgrading at once cannot deadlock. Before giving up a hold the ``before_release``
hook runs (``torch.cuda.synchronize`` for ``compute``: queued kernels still count as this holder's work).

``<gpu>`` is the physical GPU: the device's entry in ``CUDA_VISIBLE_DEVICES`` (``physical_gpu``), so
sandboxes pinned to the same card by different visible-device lists still meet on one lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator


def visible_gpu_ids() -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, as given; ``-1`` and blanks dropped), or
    None when it is not set."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    return [v.strip() for v in env.split(",") if v.strip() and v.strip() != "-1"]


def physical_gpu(index: int | None = 0) -> str:
    """The id of the physical GPU behind visible device ``index``: its ``CUDA_VISIBLE_DEVICES`` entry
    (else the index itself)."""
    index = index or 0
    ids = visible_gpu_ids() or []
    return ids[index] if index < len(ids) else str(index)


# Called with True when a lock acquisition starts to block and with False when it got the lock; a sandbox
# child reports both to its parent, which stops the task's timeout clock in between (waiting for a
# neighbour is not the task's time).
on_wait: Callable[[bool], None] | None = None
# Called with (True, lock) when this process starts holding a GPU lock (``lock.mode``: "shared" or
# "exclusive"; ``lock.kind``: what the hold is for, e.g. "forward", or None) and with (False, lock) when it
# stops (after the synchronisation on release, which is where a long step's time goes); a sandbox child
# reports both, and its parent ends a task whose one step holds the GPU past
# ``FilterSettings.gpu_step_limit_s``, or whose one forward call (after its first) had more than
# ``gpu_share_limit_s`` of the GPU (``shared_holders``).
on_hold: Callable[[bool, GpuLock], None] | None = None


class GpuLock:
    """One named reader/writer lock over one physical GPU (see the module docstring).

    ``slots`` > 0 caps how many processes hold it shared at once (a counting semaphore of ``slots`` files
    ``.<name>.slot<i>``, taken before the lock itself and polled every ``POLL_S``); 0 = no cap.

    Attributes:
        waited_s: seconds this process has spent waiting to acquire it (shared or exclusive).
        waited_exclusive_s: the part of ``waited_s`` spent waiting for exclusive holds.
        held_s: seconds this process has held it, per mode ("shared", "exclusive").
        spans: (start, end) Unix seconds of each hold since ``take_spans`` last emptied it, a hold that
            begins within ``SPAN_JOIN_S`` of the previous one's end extending it (at most ``MAX_SPANS`` kept;
            beyond that the last one is extended).
        mode: None, "shared" or "exclusive" - what this process holds now.
        kind: what the current shared hold is for (``shared(kind=...)``, e.g. "forward"), or None.
    """

    # an exclusive acquisition holds the turnstile this long at most while the shared holders drain, then
    # backs off for BACKOFF_S (doubling per failed try, at most BACKOFF_MAX_S) with the turnstile free; a
    # shared acquisition waits at most GATE_S for the queued exclusive holders before it queues itself
    DRAIN_S, BACKOFF_S, BACKOFF_MAX_S, POLL_S, GATE_S = 0.25, 0.05, 1.0, 0.0005, 0.25
    # a polling wait (a shared slot, the gate) sleeps POLL_S, then twice as long per failed try up to
    # POLL_MAX_S: fifteen evaluations polling the gate every 0.5 ms while one times its rounds would wake the
    # host 30,000 times a second next to the timed calls; at POLL_MAX_S, under 2,000
    POLL_MAX_S = 0.008
    # hold spans closer than this are recorded as one (a task's back-to-back forward calls); kept per process
    # until ``take_spans``, at most MAX_SPANS of them
    SPAN_JOIN_S, MAX_SPANS = 0.001, 4096

    def __init__(self, gpu: str, name: str, before_release: Callable[[], None] | None = None, slots: int = 0):
        base = os.path.join(tempfile.gettempdir(), f"opforge-gpu-{gpu}.{name}")
        self.paths = (base, base + ".turnstile", base + ".writers")
        self.slot_paths = [f"{base}.slot{i}" for i in range(max(0, int(slots)))]
        self.before_release = before_release
        self.mode: str | None = None
        self.kind: str | None = None
        self.waited_s = self.waited_exclusive_s = 0.0
        self.held_s = {"shared": 0.0, "exclusive": 0.0}
        self._fh = self._turn = self._gate = None
        self._slots: list = []
        self._slot = None
        self._since = 0.0
        self._since_wall = 0.0
        self.spans: list[list[float]] = []

    def take_spans(self) -> list[list[float]]:
        """The hold spans recorded since the last call ([start, end] Unix seconds, in order), emptied."""
        out, self.spans = self.spans, []
        return out

    def _record_span(self, start: float, end: float) -> None:
        if self.spans and (start - self.spans[-1][1] < self.SPAN_JOIN_S or len(self.spans) >= self.MAX_SPANS):
            self.spans[-1][1] = max(self.spans[-1][1], end)
        else:
            self.spans.append([start, end])

    # -- raw operations ----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._fh is None:
            self._fh, self._turn, self._gate = (open(p, "a") for p in self.paths)  # noqa: SIM115
            self._slots = [open(p, "a") for p in self.slot_paths]  # noqa: SIM115

    def _flock(self, fh, mode: int) -> None:
        """``flock(fh, mode)``; when it would block, ``on_wait(True)`` before and ``on_wait(False)`` after."""
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if on_wait is not None:
            on_wait(True)
        try:
            fcntl.flock(fh, mode)
        finally:
            if on_wait is not None:
                on_wait(False)

    def _acquire(self, exclusive: bool, kind: str | None = None) -> None:
        self._open()
        t0 = time.perf_counter()
        if exclusive:
            self._acquire_exclusive()
        else:
            self._take_slot()
            self._wait_for_queued_writers()
            self._flock(self._turn, fcntl.LOCK_EX)
            fcntl.flock(self._turn, fcntl.LOCK_UN)
            self._flock(self._fh, fcntl.LOCK_SH)
        self._since = time.perf_counter()
        self._since_wall = time.time()
        self.waited_s += self._since - t0
        if exclusive:
            self.waited_exclusive_s += self._since - t0
        self.mode = "exclusive" if exclusive else "shared"
        self.kind = None if exclusive else kind
        if on_hold is not None:
            on_hold(True, self)

    def _poll(self, attempt: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Call ``attempt`` until it returns True or, with ``timeout_s``, that many seconds after its first
        failure, sleeping ``POLL_S`` after the first failure and twice as long after each next one (at most
        ``POLL_MAX_S``); reports waiting through ``on_wait`` once it has to wait."""
        deadline, waiting, pause = None, False, self.POLL_S
        try:
            while not attempt():
                if timeout_s is not None:
                    now = time.perf_counter()
                    deadline = deadline or now + timeout_s
                    if now > deadline:
                        return
                waiting = waiting or self._start_waiting()
                time.sleep(pause)
                pause = min(2 * pause, self.POLL_MAX_S)
        finally:
            if waiting and on_wait is not None:
                on_wait(False)

    @staticmethod
    def _try_flock(fh, mode: int) -> bool:
        """``flock(fh, mode)`` without blocking; False when someone else holds it."""
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _take_slot(self) -> None:
        """One of the ``slots`` files, exclusively (nothing when there are none); polls until one is free,
        starting at a slot of its own so that waiting processes spread over the slots."""
        if not self._slots:
            return
        first = os.getpid() % len(self._slots)
        order = [self._slots[(first + i) % len(self._slots)] for i in range(len(self._slots))]

        def any_free() -> bool:
            self._slot = next((fh for fh in order if self._try_flock(fh, fcntl.LOCK_EX)), None)
            return self._slot is not None

        self._poll(any_free)

    def _wait_for_queued_writers(self) -> None:
        """Until no exclusive holder is queued (``.writers`` free) or ``GATE_S`` has passed."""

        def gate_free() -> bool:
            if not self._try_flock(self._gate, fcntl.LOCK_EX):
                return False
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            return True

        self._poll(gate_free, self.GATE_S)

    def _acquire_exclusive(self) -> None:
        """Queue (``.writers`` shared), turnstile, then the lock itself within ``DRAIN_S``; else free the
        turnstile and the queue place, back off, retry. Queue place and turnstile stay held with the lock:
        later shared holders wait behind them."""
        backoff, waiting = self.BACKOFF_S, False
        try:
            while True:
                fcntl.flock(self._gate, fcntl.LOCK_SH)  # blocks only while a reader checks the gate
                try:
                    fcntl.flock(self._turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    waiting = waiting or self._start_waiting()
                    fcntl.flock(self._turn, fcntl.LOCK_EX)
                deadline = time.perf_counter() + self.DRAIN_S
                while True:
                    try:
                        fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return
                    except BlockingIOError:
                        pass
                    if time.perf_counter() > deadline:
                        break
                    waiting = waiting or self._start_waiting()
                    time.sleep(self.POLL_S)
                fcntl.flock(self._turn, fcntl.LOCK_UN)
                fcntl.flock(self._gate, fcntl.LOCK_UN)
                time.sleep(backoff)
                backoff = min(2 * backoff, self.BACKOFF_MAX_S)
        finally:
            if waiting and on_wait is not None:
                on_wait(False)

    @staticmethod
    def _start_waiting() -> bool:
        if on_wait is not None:
            on_wait(True)
        return True

    def _release(self) -> None:
        try:
            if self.before_release is not None:
                self.before_release()
        finally:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            if self.mode == "exclusive":
                fcntl.flock(self._turn, fcntl.LOCK_UN)
                fcntl.flock(self._gate, fcntl.LOCK_UN)
            if self._slot is not None:
                fcntl.flock(self._slot, fcntl.LOCK_UN)
                self._slot = None
            if self.mode is not None:
                self.held_s[self.mode] += time.perf_counter() - self._since
                self._record_span(self._since_wall, time.time())
            self.mode = self.kind = None
            if on_hold is not None:
                on_hold(False, self)

    # -- context managers --------------------------------------------------------------------------
    @contextlib.contextmanager
    def shared(self, kind: str | None = None) -> Iterator[None]:
        """Hold the lock shared (no-op when this process already holds it in any mode); ``kind`` says what
        for (``GpuLock.kind``, passed to ``on_hold``)."""
        if self.mode is not None:
            yield
            return
        self._acquire(exclusive=False, kind=kind)
        try:
            yield
        finally:
            self._release()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock exclusively; a shared hold of this process is given up first and taken back after."""
        if self.mode == "exclusive":
            yield
            return
        had_shared = self.mode == "shared"
        if had_shared:
            self._release()
        self._acquire(exclusive=True)
        try:
            yield
        finally:
            self._release()
            if had_shared:
                self._acquire(exclusive=False)

    def close(self) -> None:
        if self._fh is not None:
            for fh in (self._fh, self._turn, self._gate, *self._slots):
                fh.close()
            self._fh = self._turn = self._gate = None
            self._slots = []


_LOCKS: dict[tuple[str, str], GpuLock] = {}
# Processes that may hold a GPU's ``compute`` lock shared at once (``GpuLock`` slots; 0 = any number); set
# by a sandbox child from ``FilterSettings.gpu_concurrency`` before its first lock.
COMPUTE_SLOTS = 0


def gpu_lock(name: str, gpu: str | None = None) -> GpuLock:
    """This process's ``GpuLock`` ``name`` ("compute" or "memory") over physical GPU ``gpu`` (default: the
    one behind visible device 0). ``compute`` synchronises CUDA before each release."""
    gpu = physical_gpu(0) if gpu is None else gpu
    key = (gpu, name)
    if key not in _LOCKS:
        sync, slots = None, 0
        if name == "compute":
            import torch

            sync, slots = torch.cuda.synchronize, COMPUTE_SLOTS
        _LOCKS[key] = GpuLock(gpu, name, sync, slots)
    return _LOCKS[key]


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def gpu_work(device, kind: str | None = None) -> contextlib.AbstractContextManager:
    """Context for GPU work that must not overlap a neighbour's timing: ``compute`` shared on CUDA (with
    ``kind``, e.g. "forward" for one forward call of a task), nothing on CPU."""
    return gpu_lock("compute").shared(kind) if _is_cuda(device) else contextlib.nullcontext()


def shared_holders(path: str) -> int | None:
    """How many open files hold the lock file ``path`` shared right now, from Linux's ``/proc/locks``
    (one ``FLOCK ... READ`` line per holder), or None when that cannot be read (another OS, no such file).

    The sandbox parent divides a forward call's time by this count to bound the GPU time the call had
    from below: the GPU time-slices between the processes with work (all of them hold the lock shared),
    and a holder that runs no kernels leaves its share to the others."""
    try:
        st = os.stat(path)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as fh:
            return sum(1 for line in fh if " FLOCK " in line and " READ " in line and f" {key} " in line)
    except OSError:
        return None


def gpu_timing(device) -> contextlib.AbstractContextManager:
    """Context for a timed measurement: ``compute`` exclusive on CUDA, nothing on CPU."""
    return gpu_lock("compute").exclusive() if _is_cuda(device) else contextlib.nullcontext()


def lock_holds() -> dict[str, float]:
    """Seconds this process has held its GPU locks so far, per lock name and mode (``compute_shared``,
    ``compute_exclusive``), summed over GPUs."""
    out: dict[str, float] = {}
    for (_, name), lock in _LOCKS.items():
        for mode, held in lock.held_s.items():
            out[f"{name}_{mode}"] = out.get(f"{name}_{mode}", 0.0) + held
    return out


def take_hold_spans(name: str = "compute") -> list[list[float]]:
    """The hold spans of this process's ``name`` locks since the last call ([start, end] Unix seconds, merged
    where they overlap or touch, in order; ``GpuLock.take_spans``), emptied."""
    spans = sorted(s for (_, n), lock in _LOCKS.items() if n == name for s in lock.take_spans())
    out: list[list[float]] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def encode_spans(spans: list[list[float]]) -> tuple[float | None, list[list[int]]]:
    """``spans`` ([start, end] Unix seconds) as (t0, [[start_ms, end_ms], ...]): t0 the first start in Unix
    seconds rounded to the millisecond, each span in whole milliseconds after it (a ledger line a third as
    long as the seconds written out). (None, []) for no spans."""
    if not spans:
        return None, []
    t0 = round(spans[0][0], 3)
    return t0, [[round((a - t0) * 1000), round((b - t0) * 1000)] for a, b in spans]


def decode_spans(t0: float | None, ms) -> list[list[float]]:
    """The [start, end] Unix-second spans ``encode_spans`` gave (t0, ms); [] when either is missing."""
    if t0 is None or not ms:
        return []
    return [[t0 + a / 1000, t0 + b / 1000] for a, b in ms]


def lock_waits() -> dict[str, float]:
    """Seconds waited so far in this process, per lock name (summed over GPUs; ``memory`` is the
    ``MemoryBudget``'s admission), and per lock the part spent waiting for exclusive holds
    (``<name>_exclusive``)."""
    out: dict[str, float] = {}
    for (_, name), lock in _LOCKS.items():
        out[name] = out.get(name, 0.0) + lock.waited_s
        out[f"{name}_exclusive"] = out.get(f"{name}_exclusive", 0.0) + lock.waited_exclusive_s
    for budget in _BUDGETS.values():
        out["memory"] = out.get("memory", 0.0) + budget.waited_s
    return out


# Defaults of the admission, shared by the filter stage (FilterSettings) and the harness (EvalConfig):
# share of the GPU's memory tasks may reserve together (the rest: CUDA contexts, cuBLAS / Triton
# workspaces); what a task reserves before it has measured anything (GiB: half the median peak of composed
# tasks on an H200 run, 7.7 GiB); the factor over the allocator's peak so far a running task grows to.
ADMIT_FRACTION, ADMIT_GIB, ADMIT_GROWTH = 0.9, 4.0, 1.25
# The filter stage's start reservation from a prediction (``engine.memory_estimate``): this factor x the
# predicted peak of the eager forward, at least ADMIT_MIN_GIB. Over 693 composed tasks on an H200 the whole
# chain's allocator peak was 1.5 / 2.0 / 3.4 x the predicted forward peak (p10 / median / p90; the chain
# adds the determinism filter's second model and the compiled outputs), and the reservation grows after
# every GPU step anyway; 1.5 finished 560 tasks in 138.5 s against 144.2 s with 2.0, neither with a task
# re-run alone for want of memory (measured 2026-11-22, one H200; record in the
# git history of docs/benchmark-log.md).
ADMIT_PREDICTED, ADMIT_MIN_GIB = 1.5, 0.5


class MemoryBudget:
    """Admission of tasks to one physical GPU by reserved memory, across processes.

    A task is admitted (``admit``) when the reservations of the tasks already on the GPU plus its own fit
    ``capacity_gib``, or when no task holds any. Waiting tasks queue in arrival order, with backfilling: a
    task whose reservation fits may start before the ones queued ahead of it that do not fit yet, but only
    while each of those has waited less than ``PATIENCE_S``; once one has waited that long, no one passes
    it any more and the memory drains until it fits. So small tasks fill the room a large one leaves while
    it waits, and a large reservation (a task re-run alone asks for all of it) is still never starved by a
    stream of small ones: beyond strictly first come, first served it waits at most ``PATIENCE_S`` plus
    the run of the tasks that passed it meanwhile. ``PATIENCE_S`` is read by the task that would pass.
    A running task's reservation grows (``resize``) without waiting: it records what the task measured,
    and two growing tasks must never wait for each other; the over-commit only holds back new tasks.
    Waiting reports through ``on_wait`` like the locks.

    State: JSON ``{"held": {owner: GiB}, "queue": [owner, ...], "since": {owner: unix time queued}}`` in
    ``$TMPDIR/opforge-gpu-<gpu>.budget``, read and written under ``flock``. Owners are process ids
    (``owner`` overrides, for tests); an owner whose process is gone (a child killed on timeout) is
    dropped, so its share comes back.

    Attributes:
        waited_s: seconds this process has waited for admission.
        held_gib: this owner's reservation now (0 when none).
    """

    # seconds a queued task may be passed by later ones whose reservation fits (backfilling); tasks take
    # ~2-4 s each on an H200 with 14 sandboxes, so a large one loses at most a fraction of a task's time
    POLL_S, PATIENCE_S = 0.01, 1.0

    def __init__(self, gpu: str, capacity_gib: float, owner: str | None = None):
        self.path = os.path.join(tempfile.gettempdir(), f"opforge-gpu-{gpu}.budget")
        self.capacity_gib = float(capacity_gib)
        self.owner = owner or str(os.getpid())
        self.waited_s = 0.0
        self.held_gib = 0.0

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict]:
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read()
            try:
                state = json.loads(text) if text.strip() else {}
            except json.JSONDecodeError:
                state = {}
            state.setdefault("held", {})
            state.setdefault("queue", [])
            state.setdefault("since", {})
            alive = {o for o in [*state["held"], *state["queue"]] if _alive(o)}
            state["held"] = {o: g for o, g in state["held"].items() if o in alive}
            state["queue"] = [o for o in state["queue"] if o in alive]
            state["since"] = {o: t for o, t in state["since"].items() if o in state["queue"]}
            yield state
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(state))

    def admit(self, gib: float) -> None:
        """Wait until ``gib`` (capped at the capacity) fits next to the other reservations and no task
        queued ahead has waited ``PATIENCE_S`` or longer, then hold it. Raises RuntimeError when this
        owner already holds a reservation."""
        gib = min(float(gib), self.capacity_gib)
        if self.held_gib:
            raise RuntimeError(f"{self.owner} already holds {self.held_gib} GiB of {self.path}")
        t0 = time.perf_counter()
        waiting = False
        try:
            while True:
                with self._state() as state:
                    now = time.time()
                    if self.owner not in state["queue"]:
                        state["queue"].append(self.owner)
                        state["since"][self.owner] = now
                    ahead = state["queue"][:state["queue"].index(self.owner)]
                    used = sum(g for o, g in state["held"].items() if o != self.owner)
                    fits = not state["held"] or used + gib <= self.capacity_gib
                    if fits and all(now - state["since"].get(o, now) < self.PATIENCE_S for o in ahead):
                        state["queue"].remove(self.owner)
                        state["since"].pop(self.owner, None)
                        state["held"][self.owner] = gib
                        self.held_gib = gib
                        return
                if not waiting and on_wait is not None:
                    on_wait(True)
                waiting = True
                time.sleep(self.POLL_S)
        finally:
            if waiting and on_wait is not None:
                on_wait(False)
            self.waited_s += time.perf_counter() - t0

    def resize(self, gib: float) -> None:
        """Set this owner's reservation to ``gib`` (capped at the capacity) at once, never waiting."""
        gib = min(float(gib), self.capacity_gib)
        with self._state() as state:
            state["held"][self.owner] = gib
        self.held_gib = gib

    def release(self) -> None:
        """Give this owner's reservation (and any queue place) back."""
        with self._state() as state:
            state["held"].pop(self.owner, None)
            state["since"].pop(self.owner, None)
            if self.owner in state["queue"]:
                state["queue"].remove(self.owner)
        self.held_gib = 0.0

    def usage(self) -> tuple[float, int]:
        """(GiB reserved by all owners, owners waiting)."""
        with self._state() as state:
            return sum(state["held"].values()), len(state["queue"])


def _alive(owner: str) -> bool:
    """False only for a numeric owner whose process no longer exists."""
    if not owner.isdigit():
        return True
    try:
        os.kill(int(owner), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_BUDGETS: dict[str, MemoryBudget] = {}


def admitted_on_gpu(fraction: float = ADMIT_FRACTION, start_gib: float = ADMIT_GIB, alone: bool = False
                    ) -> MemoryBudget:
    """Admit this process's next task to visible GPU 0's ``MemoryBudget`` (capacity ``fraction`` x its
    memory): ``start_gib``, or the whole capacity when ``alone``. Returns the budget (``release`` it)."""
    import torch

    budget = memory_budget(fraction * torch.cuda.get_device_properties(0).total_memory / 2**30)
    budget.admit(budget.capacity_gib if alone else start_gib)
    return budget


def grow_to_peak(budget: MemoryBudget, growth: float = ADMIT_GROWTH) -> None:
    """Grow ``budget``'s reservation to ``growth`` x the CUDA allocator's peak so far (never waits)."""
    import torch

    measured = torch.cuda.max_memory_reserved() / 2**30 * growth
    if measured > budget.held_gib:
        budget.resize(measured)


def memory_budget(capacity_gib: float, gpu: str | None = None) -> MemoryBudget:
    """This process's ``MemoryBudget`` over physical GPU ``gpu`` (default: the one behind visible device
    0). ``capacity_gib`` is used when it is first made."""
    gpu = physical_gpu(0) if gpu is None else gpu
    if gpu not in _BUDGETS:
        _BUDGETS[gpu] = MemoryBudget(gpu, capacity_gib)
    return _BUDGETS[gpu]
