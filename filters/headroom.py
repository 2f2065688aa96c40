"""``roofline``, ``headroom_screen`` and ``headroom`` filters: a task where neither fusion nor a better kernel
can win much is rejected ``trivial:no_headroom``.

Stages of one rule, each where its inputs exist:

* ``roofline`` (static, right after ``contamination``, before any execution): the task's roofline traced on
  ``meta`` (``opforge.task.roofline``): per-op and fused times on the run's GPU peaks, ``fusion_gain =
  per_op_ms / roofline_ms``. Cheap (about 10 ms a task on one core). ``min_fusion_gain`` ``auto`` (the default)
  rejects, on CUDA, a task of two or more ops whose fusion gain is below ``CUDA_MIN_FUSION_GAIN`` (1.25): one op
  (a GEMM or a convolution with a small norm, activation or residual beside it) holds most of its roofline time,
  and fusing the rest saves under 20 % of it; on CPU it only records. A task of one op has nothing to fuse and is
  judged by its room alone (``headroom``). A number rejects any task below it, whatever the device and op count;
  None only records. A task that cannot be traced on ``meta`` (an op with no meta kernel, ``.item()``) is not
  judged: ``roofline_error`` says why.

  1.25: two fresh blind readers of 60 rows of a 4 x H200 run (``benchmarks/results/h200/release_v2_partial.json``)
  judged 5 of the 13 rows below 1.25 a fusion worth writing and 40 of the 47 at or above it; at 1.25 the tasks
  selectable from that run's first 9 rounds kept 82 % of the accepted pool, fusion gain p50 2.09 (1.98 without),
  heavy-op share 69 % (71 %) and about 19 % with a convolution (22 %).
* ``headroom_screen`` (right after ``runtime_screen``, before the determinism, degenerate, trivial, compile and
  runtime filters): ``room`` is at most ``eager_ms / roofline_ms``, and the screen's one warm call
  (``runtime_screen``'s ``screen_ms``) is at least ``slack`` (0.9) x the runtime filter's ``eager_ms``, so
  ``room_bound = screen_ms / (slack * roofline_ms)`` bounds the room from above; a task with ``room_bound <
  min_room`` cannot pass ``headroom`` and is rejected here, before the costliest checks (compile is half the
  sandbox seconds). ``min_room`` is the ``headroom`` filter's own (its threshold override included), and the
  screen runs only where ``headroom`` does. On CUDA only. Measured on two 1,000-task runs on 2 x H100
  (``benchmarks/results/h100/worthwhile_tasks.json``, ``filter/ledger.jsonl`` of each run): ``screen_ms /
  eager_ms`` p1 0.956, p50 1.09-1.11; none of the 2,323 accepted tasks had ``screen_ms / roofline_ms`` below
  1.8, while 611 of the 4,405 ``trivial:no_headroom`` rejections and 48 tasks rejected by later filters had:
  6.3 % of the runs' sandbox seconds.
* ``headroom`` (after ``runtime``, which times eager and the ``torch.compile``-d model): ``room =
  min(eager_ms, compile_ms) / roofline_ms``, what a perfect kernel wins over the better of the two. Rejects
  when ``room < min_room``. Without GPU times (CPU runs, ``--skip runtime``) ``room`` is None and the rule
  does not apply.

Peaks (``peaks`` threshold of ``roofline``): ``auto`` takes the run's GPU (``nvidia-smi``'s model name of the
sandbox's visible GPU, never initialising CUDA) and falls back to the H200 SXM datasheet for a CPU run or a
GPU not in ``opforge.task.peaks.GPU_PEAKS``; ``peaks_source`` in the metrics says which. A name (``h100``,
``h200``) fixes them.

Default ``min_room`` 2: a hand-written kernel at a realistic 75 % of the roofline then wins at least 1.5x over
the better of eager and Inductor; below 2 the best of them is already close to what any kernel reaches. On
an H200 (``benchmarks/worthwhile_report.py``, ``benchmarks/results/h200/worthwhile_tasks.json``: the 353
accepted tasks of a 450-candidate run at the 0.04 ms window floor), the tasks below 2 are mostly
memory-bound chains Inductor already fuses into one kernel (element-wise chains, norm + residual, rotary,
embeddings: room p50 1.24-1.40, the ratio of the datasheet bandwidth to what a kernel attains), while
attention and conv + norm + activation keep room p50 3.6-4.3. ``min_room`` 2 keeps 52 % of the accepted
tasks and lifts their fusion gain p50 from 2.0 to 2.3.
"""

from __future__ import annotations

from typing import Any

from opforge.engine.ledger import visible_gpu_name
from opforge.filters.verdict import Cost, Filter, TaskInput, Verdict

REASON = "trivial:no_headroom"
CUDA_MIN_FUSION_GAIN = 1.25  # the ``roofline`` filter's ``auto`` floor on CUDA (module docstring)
MAX_LISTED_OPS = 16  # ``ops`` metric of ``roofline``: the costliest ops, at most this many


def resolve_peaks(setting: str, device: str, gpu_name: str | None = None):
    """(``DevicePeaks``, how they were chosen) for the ``peaks`` threshold (``auto`` or a name) on
    ``device`` ("cpu" / "cuda..."), the GPU being ``gpu_name`` (default: ``visible_gpu_name()``).
    Raises ValueError for an unknown name."""
    from opforge.task.peaks import DEFAULT_PEAKS, get_peaks, peaks_for_gpu

    if setting != "auto":
        return get_peaks(setting), "threshold"
    if not str(device).startswith("cuda"):
        return DEFAULT_PEAKS, "cpu run: default"
    name = gpu_name or visible_gpu_name()
    found = peaks_for_gpu(name)
    if found is None:
        return DEFAULT_PEAKS, f"GPU {name!r} not listed: default"
    return found, f"GPU {name!r}"


class RooflineFilter(Filter):
    """Scores a task's roofline on ``meta`` (module docstring); rejects ``trivial:no_headroom`` when its fusion
    gain is below the floor ``min_fusion_gain`` sets.

    Thresholds: ``peaks`` (``auto`` or a ``GPU_PEAKS`` name), ``min_fusion_gain`` (``auto``: on CUDA
    ``CUDA_MIN_FUSION_GAIN`` for tasks of two or more ops, else none; a number: for every task; None: record
    only).
    Metrics: ``opforge.task.roofline.Roofline.as_metrics`` (``flops``, ``bytes``, ``compute_ms``,
    ``memory_ms``, ``per_op_ms``, ``roofline_ms`` in ms, ``fusion_gain``, ``bound``, ``peaks``, ``op_count``,
    ``ops``: the costliest ``MAX_LISTED_OPS`` as ``{"op", "flops", "bytes", "ms"}``), ``device``,
    ``peaks_source``; or ``roofline_error`` when the task could not be traced on ``meta``.
    """

    name = "roofline"
    cost = Cost.STATIC
    version = 2

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"peaks": "auto", "min_fusion_gain": "auto"}

    def score(self, task: TaskInput) -> dict[str, Any]:
        from opforge.task.roofline import RooflineError, roofline

        device = str(getattr(task, "device", "cpu"))
        peaks, source = resolve_peaks(self.thresholds["peaks"], device)
        m: dict[str, Any] = {"device": device, "peaks": peaks.name, "peaks_source": source}
        try:
            m.update(roofline(task.code, peaks, name=task.task_id).as_metrics(MAX_LISTED_OPS))
        except RooflineError as exc:
            m["roofline_error"] = str(exc)[:400]
        return m

    def __init__(self, **thresholds):
        super().__init__(**thresholds)
        floor = self.thresholds["min_fusion_gain"]
        if floor not in ("auto", None) and (isinstance(floor, bool) or not isinstance(floor, (int, float))):
            raise ValueError(f"thresholds: roofline.min_fusion_gain {floor!r}: give auto, a number or null")

    def floor(self, m: dict[str, Any]) -> float | None:
        """The fusion-gain floor for a task with metrics ``m`` (None: no floor)."""
        floor = self.thresholds["min_fusion_gain"]
        if floor == "auto":
            multi = (m.get("op_count") or 0) >= 2
            return CUDA_MIN_FUSION_GAIN if multi and str(m.get("device", "")).startswith("cuda") else None
        return floor

    def decide(self, m: dict[str, Any]) -> Verdict:
        floor = self.floor(m)
        gain = m.get("fusion_gain")
        if floor is not None and gain is not None and gain < floor:
            return self.reject(REASON, m)
        return self.accept(m)


class HeadroomFilter(Filter):
    """Rejects ``trivial:no_headroom`` when ``room < min_room`` (module docstring). Reads the ``roofline`` and
    ``runtime`` filters' metrics of the same task; measures the roofline itself (``auto`` peaks) when the
    ``roofline`` filter did not run.

    Thresholds: ``min_room`` (a ratio of times; default 2).
    Metrics: ``roofline_ms``, ``fusion_gain``, ``peaks`` (from ``roofline``; None when it did not run or could
    not trace the task), ``eager_ms``, ``compile_ms`` (from ``runtime``, on CUDA; None otherwise),
    ``best_ms`` (the smaller of the two), ``room`` (``best_ms / roofline_ms``, None without GPU times).
    """

    name = "headroom"
    cost = Cost.STATIC  # reads earlier metrics only
    version = 2
    reads = ("roofline", "runtime")

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"min_room": 2.0}

    def score(self, task: TaskInput, earlier: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        earlier = earlier or {}
        device = str(getattr(task, "device", "cpu"))
        rl, rt = earlier.get("roofline"), earlier.get("runtime", {})
        if rl is None:  # the roofline filter was left out of the chain: measure here (``auto`` peaks)
            rl = RooflineFilter().score(task)
        m = {"roofline_ms": rl.get("roofline_ms"), "fusion_gain": rl.get("fusion_gain"), "peaks": rl.get("peaks"),
             "eager_ms": None, "compile_ms": None, "best_ms": None, "room": None}
        if device.startswith("cuda"):
            m["eager_ms"], m["compile_ms"] = _number(rt.get("eager_ms")), _number(rt.get("compile_ms"))
        times = [t for t in (m["eager_ms"], m["compile_ms"]) if t is not None and t > 0]
        if times:
            m["best_ms"] = min(times)
            if m["roofline_ms"]:
                m["room"] = round(m["best_ms"] / m["roofline_ms"], 4)
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        return _below_min_room(self, m, "room")


def _below_min_room(f: Filter, m: dict[str, Any], key: str) -> Verdict:
    """``trivial:no_headroom`` when metric ``key`` is known and below ``f``'s ``min_room``, else accepted."""
    room = m.get(key)
    if room is not None and room < f.thresholds["min_room"]:
        return f.reject(REASON, m)
    return f.accept(m)


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class HeadroomScreenFilter(Filter):
    """Rejects ``trivial:no_headroom`` on CUDA when ``room_bound = screen_ms / (slack * roofline_ms) <
    min_room`` (module docstring): the ``headroom`` filter would reject the task after compile and timing.

    Thresholds: ``min_room`` (set by ``filters.chain.make_chain`` to the ``headroom`` filter's), ``slack`` (the
    least ``screen_ms / eager_ms`` assumed; default 0.9).
    Metrics: ``screen_ms`` (from ``runtime_screen``), ``roofline_ms`` (from ``roofline``), ``room_bound``
    (None on CPU, or without either time).
    """

    name = "headroom_screen"
    cost = Cost.STATIC  # reads earlier metrics only
    version = 1
    reads = ("roofline", "runtime_screen")

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"min_room": HeadroomFilter.default_thresholds()["min_room"], "slack": 0.9}

    def score(self, task: TaskInput, earlier: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        earlier = earlier or {}
        screen = _number((earlier.get("runtime_screen") or {}).get("screen_ms"))
        roof = _number((earlier.get("roofline") or {}).get("roofline_ms"))
        m = {"screen_ms": screen, "roofline_ms": roof, "room_bound": None}
        if str(getattr(task, "device", "cpu")).startswith("cuda") and screen and roof:
            m["room_bound"] = round(screen / (self.thresholds["slack"] * roof), 4)
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        return _below_min_room(self, m, "room_bound")

