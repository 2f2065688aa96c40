"""Hidden shape variants of a published task: other input shapes the grader also checks, so a kernel that
hard-codes the public shape fails.

``shape_variants(row)`` is a pure function of a published row (``code``, ``task_id``, ``size_context`` when
present, ``dtype``, ``eager_ms`` / ``gpu`` when present) and a seed, so variants can be added to a dataset that is
already published (``opforge variants``) and every re-run gives the same ones. A variant is a set of new values
for the task's *free* size constants (``opforge.task.sizes``: top-level int constants that only ``get_inputs``
reads), written as ``{"sizes": {"batch_size": 96, "seq_len": 512}, "input_shapes": [[96, 512, 4096]],
"work_ratio": 0.19}``; the grader draws the variant's inputs from the task source with those values
(``task.sizes.with_sizes``) and runs the task's one ``Model`` on them.

Which constants move:

* the batch (``batch_size`` and the usual spellings, ``BATCH_NAMES``), to other values of the shape vocabulary's
  ``batch`` axis (1-512, ``seeds.vocabulary``);
* for rows with a ``size_context`` (composed from real model configs, ``compose.graphs.sizing``), also the sequence
  length (``seq_len``...: vocabulary ``seq`` values 16-8192, ``sizing.SEQ_MIN`` / ``SEQ_MAX``), the feature-map
  side (``height`` and ``width`` together: ``spatial`` values 4-512) or the video depth (``depth``: ``depth``
  values), each to a vocabulary value within a factor ``AXIS_FACTOR`` of the public one;
* channel and feature sizes never (the weights fix them; such constants are not free anyway). Rows without a
  ``size_context`` (Ops-6K and other hand-written tasks) vary only the batch.

Each candidate is validated on the ``meta`` device (no memory, no compute): the task's ``Model`` built at the
public sizes runs ``forward`` on the variant's inputs, op by op under a counter of FLOPs and bytes
(``compose.graphs.cost_model.Cost``, the roofline of the ``h200`` profile). A candidate is kept when it runs, its input
shapes differ from the public ones and from every kept variant, its inputs hold at most ``input_cap_bytes``
(the composer's cap, 0.9 GB) and its predicted time is at most ``work_ratio_cap`` times the public one
(``max_work_ratio``; with a GPU-measured ``eager_ms``, also at most the top of the runtime window shrunk by the
composer's margin, 62.5 ms): a smaller batch is always fine. Up to ``max_tries`` candidates are tried; a task
that keeps fewer than ``count`` gets what it has, and ``VariantResult.reason`` says why.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GENERATOR = "opforge-variants/1"
BATCH_NAMES = ("batch_size", "batch", "bs", "batch_dim", "n_batch", "num_batch", "nbatch", "N", "B")
SEQ_NAMES = ("seq_len", "seq_length", "sequence_length", "seqlen", "n_tokens", "num_tokens", "length", "L", "T")
SPATIAL_PAIRS = (("height", "width"), ("H", "W"), ("h", "w"), ("img_height", "img_width"),
                 ("input_height", "input_width"))
SPATIAL_SINGLE = ("image_size", "img_size", "spatial", "resolution")
DEPTH_NAMES = ("depth", "D", "frames", "num_frames")
# variants_for_rows: this few rows (default workers) run here, not in spawned workers. A row takes about
# 0.06 s (42 rows of the v2.0 release: 3.3 s in this process, 4.5 s in 2 spawned workers, cpu-2core), while
# spawning workers that import torch costs seconds each; 42 rows in 64 workers took 32 s on a 64-vCPU GPU host
# busy closing its cluster.
IN_PROCESS_ROWS = 64
AXIS_FACTOR = 4.0  # a moved sequence / spatial / depth size stays within [public / 4, public * 4]
SPATIAL_RANGE = (4, 512)


class VariantError(ValueError):
    """A row cannot be read (no ``code`` / ``task_id``); the message names the row."""


@dataclass
class VariantResult:
    """Variants of one row. ``variants``: the kept ones (see the module doc); ``tried``: candidates
    validated; ``reason``: why fewer than asked were kept (``no_free_size``, ``meta:<Exc>``, ``few_valid``), or
    None."""

    task_id: str
    variants: list[dict[str, Any]] = field(default_factory=list)
    tried: int = 0
    reason: str | None = None

    def to_json(self) -> str:
        """The ``shape_variants`` column value: the JSON list of variants."""
        return json.dumps(self.variants, sort_keys=True)


@dataclass(frozen=True)
class VariantSettings:
    """What ``shape_variants`` keeps (see the module doc).

    Attributes:
        seed: mixed with the ``task_id`` into each row's random stream.
        count: variants wanted per task.
        max_tries: candidates validated at most per task.
        input_cap_bytes: most bytes a variant's inputs may hold (``DeviceProfile.input_cap_bytes`` of the GPU
            profiles), unless the public inputs already hold more and the variant no more than those.
        max_work_ratio: most predicted time of a variant over the public shape's.
        window_top_ms: with a GPU-measured ``eager_ms``, a variant's ``eager_ms * ratio`` stays below this
            (the runtime window's top, 100 ms, over the composer's margin 1.6).
    """

    seed: int = 0
    count: int = 2
    max_tries: int = 10
    input_cap_bytes: int = 900_000_000
    max_work_ratio: float = 2.0
    window_top_ms: float = 100.0 / 1.6


# ---- which constants move, and to what ------------------------------------------------------------------

@dataclass
class _Axes:
    batch: str | None
    moves: list[tuple[str, tuple[str, ...]]]  # (vocabulary axis, constant names moved together)


def _axes(free: set[str], constants: dict[str, int], realistic: bool) -> _Axes:
    batch = next((n for n in BATCH_NAMES if n in free), None)
    moves: list[tuple[str, tuple[str, ...]]] = []
    if realistic:
        seq = next((n for n in SEQ_NAMES if n in free), None)
        if seq:
            moves.append(("seq", (seq,)))
        pair = next((p for p in SPATIAL_PAIRS if all(n in free for n in p)), None)
        if pair:
            moves.append(("spatial", pair))
        else:
            single = next((n for n in SPATIAL_SINGLE if n in free), None)
            if single:
                moves.append(("spatial", (single,)))
        depth = next((n for n in DEPTH_NAMES if n in free), None)
        if depth:
            moves.append(("depth", (depth,)))
    return _Axes(batch, moves)


def _vocab_values(vocab, axis: str, public: int) -> list[int]:
    from opforge.compose.graphs.sizing import SEQ_MAX, SEQ_MIN

    if axis == "batch":
        vals = vocab.values("batch", 1, 512)
    elif axis == "seq":
        vals = vocab.values("seq", SEQ_MIN, SEQ_MAX)
    elif axis == "spatial":
        vals = vocab.values("spatial", *SPATIAL_RANGE)
    else:
        vals = vocab.values("depth", 1, 64)
    if axis != "batch":
        vals = [v for v in vals if public / AXIS_FACTOR <= v <= public * AXIS_FACTOR]
    return [v for v in vals if v != public]


def _row_rng(task_id: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{GENERATOR}:{seed}:{task_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def _candidates(axes: _Axes, constants: dict[str, int], vocab, rng: random.Random, n: int) -> list[dict[str, int]]:
    """Up to ``n`` distinct size assignments: one free axis moved, the batch moved, both, in turn."""
    batch_vals: list[int] = []
    if axes.batch:
        b0 = constants[axes.batch]
        vals = _vocab_values(vocab, "batch", b0)
        smaller = [v for v in vals if v < b0]
        larger = [v for v in vals if v > b0]
        rng.shuffle(smaller)
        rng.shuffle(larger)
        # smaller batches first (always within the window), then the nearest larger ones
        batch_vals = smaller + sorted(larger)[:3]
    axis_moves: list[dict[str, int]] = []
    for axis, names in axes.moves:
        public = constants[names[0]]
        vals = _vocab_values(vocab, axis, public)
        rng.shuffle(vals)
        for v in vals[:4]:
            move = {names[0]: v}
            for other in names[1:]:  # width follows height by the same factor, to a value of the same axis
                w0 = constants[other]
                move[other] = v if w0 == public else max(1, round(w0 * v / public))
            axis_moves.append(move)
    rng.shuffle(axis_moves)
    out: list[dict[str, int]] = []
    seen: set[tuple] = set()

    def add(sizes: dict[str, int]) -> None:
        key = tuple(sorted(sizes.items()))
        if sizes and key not in seen and len(out) < n:
            seen.add(key)
            out.append(sizes)

    ai = bi = 0
    for step in range(3 * n):
        kind = step % 3
        if kind == 0 and ai < len(axis_moves):
            add(dict(axis_moves[ai]))
            ai += 1
        elif kind == 1 and bi < len(batch_vals):
            add({axes.batch: batch_vals[bi]})
            bi += 1
        elif kind == 2 and axis_moves and batch_vals:
            add({**axis_moves[rng.randrange(len(axis_moves))], axes.batch: rng.choice(batch_vals)})
    return out


# ---- validation on meta ---------------------------------------------------------------------------------

def _count_mode():
    """A dispatch mode that records each aten op's FLOPs (``torch.utils.flop_counter`` formulas) and bytes
    (tensor arguments and outputs)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.flops: list[float] = []
            self.bytes: list[float] = []
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if func.is_view or not outs:
                return out
            nbytes = sum(t.numel() * t.element_size() for t in tensors + outs)
            self.largest = max([self.largest] + [t.numel() * t.element_size() for t in outs])
            flops = 0.0
            if packet in flop_registry:
                try:
                    flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
                except Exception:  # noqa: BLE001 - a formula that does not apply: count the bytes only
                    flops = 0.0
            self.flops.append(flops)
            self.bytes.append(float(nbytes))
            return out

    return Count()


@dataclass
class _Run:
    shapes: list[list[int] | None]
    input_bytes: int
    predicted_ms: float
    largest: int


def _meta_run(model, inputs: list[Any], dtype: str):
    import torch
    from opforge.compose.device_profiles import get_profile
    from opforge.compose.graphs.cost_model import Cost

    shapes = [list(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
    input_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    mode = _count_mode()
    with torch.no_grad(), mode:
        model(*inputs)
    cost = Cost(flops=sum(mode.flops), bytes=sum(mode.bytes), n_ops=len(mode.flops), peak_bytes=0.0,
                input_bytes=float(input_bytes), dtype=dtype, op_flops=mode.flops, op_bytes=mode.bytes)
    return _Run(shapes, input_bytes, cost.predict_ms(get_profile("h200")), mode.largest)


def _meta_inputs(task) -> list[Any]:
    import torch

    torch.manual_seed(0)
    with torch.device("meta"):
        return [x.to("meta") if isinstance(x, torch.Tensor) else x for x in task.inputs()]


def shape_variants(row: Mapping[str, Any], settings: VariantSettings | None = None, vocab=None) -> VariantResult:
    """The hidden shape variants of one published row (see the module doc). Runs the task's code on ``meta``
    in this process (use ``variants_for_rows`` for many rows, in sandboxed workers).

    Raises:
        VariantError: the row has no ``code`` or ``task_id``.
    """
    import torch
    from opforge.task.sizes import free_constants, size_constants, with_sizes
    from opforge.task.source import load_task

    settings = settings or VariantSettings()
    code, task_id = row.get("code"), row.get("task_id")
    if not isinstance(code, str) or not task_id:
        raise VariantError(f"row {task_id!r}: needs 'code' and 'task_id'")
    task_id = str(task_id)
    result = VariantResult(task_id)
    try:
        constants = size_constants(code, task_id)
        free = free_constants(code, task_id)
    except ValueError as exc:
        result.reason = f"invalid_task:{type(exc).__name__}"
        return result
    realistic = bool(row.get("size_context"))
    axes = _axes(free, constants, realistic)
    if not axes.batch and not axes.moves:
        result.reason = "no_free_size"
        return result
    if vocab is None:
        from opforge.seeds.vocabulary import default_vocabulary

        vocab = default_vocabulary()
    dtype = str(row.get("dtype") or "float32")
    try:
        task = load_task(code, task_id)
        torch.manual_seed(0)
        with torch.device("meta"):
            model = task.build()
        if isinstance(model, torch.nn.Module):
            model = model.to("meta").eval()
        public = _meta_run(model, _meta_inputs(task), dtype)
    except Exception as exc:  # noqa: BLE001 - a task that does not run on meta gets no variants
        result.reason = f"meta:{type(exc).__name__}"
        return result
    cap_ratio = settings.max_work_ratio
    eager_ms = row.get("eager_ms")
    if isinstance(eager_ms, (int, float)) and math.isfinite(eager_ms) and eager_ms > 0 \
            and str(row.get("gpu") or "cpu") != "cpu":
        cap_ratio = max(1.0, min(cap_ratio, settings.window_top_ms / eager_ms))
    input_cap = max(settings.input_cap_bytes, public.input_bytes)
    rng = _row_rng(task_id, settings.seed)
    seen = [public.shapes]
    for sizes in _candidates(axes, constants, vocab, rng, settings.max_tries):
        result.tried += 1
        try:
            variant_task = load_task(with_sizes(code, sizes, task_id), task_id)
            run = _meta_run(model, _meta_inputs(variant_task), dtype)
        except Exception:  # noqa: BLE001 - the public model does not run on these shapes: not a variant
            continue
        ratio = run.predicted_ms / max(public.predicted_ms, 1e-9)
        if run.shapes in seen or run.input_bytes > input_cap or ratio > cap_ratio:
            continue
        seen.append(run.shapes)
        result.variants.append({"sizes": dict(sorted(sizes.items())), "input_shapes": run.shapes,
                                "work_ratio": round(ratio, 4)})
        if len(result.variants) >= settings.count:
            break
    if len(result.variants) < settings.count:
        result.reason = "few_valid"
    return result


# ---- many rows, in sandboxed workers ----------------------------------------------------------------------

def _init_worker() -> None:
    import os
    import warnings

    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # meta only: no worker creates a CUDA context
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)


def _unit(rows: list[dict[str, Any]], settings: VariantSettings) -> list[VariantResult]:
    from opforge.seeds.vocabulary import default_vocabulary

    vocab = default_vocabulary()
    return [shape_variants(r, settings, vocab) for r in rows]


def _cache_key(row: Mapping[str, Any], settings: VariantSettings) -> str:
    fields = {k: row.get(k) for k in ("task_id", "code", "size_context", "dtype", "eager_ms", "gpu")}
    blob = json.dumps([GENERATOR, fields, settings.__dict__], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def variants_for_rows(rows: list[Mapping[str, Any]], settings: VariantSettings | None = None,
                      workers: int | None = None, timeout_s: float = 300.0, cache_path=None,
                      progress: bool = True, stats: dict[str, int] | None = None) -> list[VariantResult]:
    """``shape_variants`` of every row, in input order, in a pool of spawned workers (``workers``: processes,
    default the usable cores, never more than the chunks of rows; 0 runs in this process, as does the default
    for at most ``IN_PROCESS_ROWS`` rows left to compute, where starting workers costs more than the rows).
    Rows go in chunks of up to 8; a chunk that runs past ``timeout_s`` or kills its worker is run again one
    row at a time, and a row that still fails gets no variants (``reason`` ``timeout`` or ``crash``). With
    ``cache_path`` (JSONL), results keyed by the row's content and the settings are read from it and new ones
    appended, so a re-run costs nothing. ``stats``, when given, receives ``cached`` (rows read from the
    cache), ``computed`` (rows computed now) and ``workers`` (processes started; 0: computed in this process,
    or nothing to compute).

    Raises:
        VariantError: a row without ``code`` or ``task_id``.
    """
    import multiprocessing
    import os
    from pathlib import Path

    from tqdm.auto import tqdm

    settings = settings or VariantSettings()
    rows = [dict(r) for r in rows]
    for i, r in enumerate(rows):
        if not isinstance(r.get("code"), str) or not r.get("task_id"):
            raise VariantError(f"row {i} ({r.get('task_id')!r}): needs 'code' and 'task_id'")
    keys = [_cache_key(r, settings) for r in rows]
    cached: dict[str, VariantResult] = {}
    if cache_path is not None and Path(cache_path).exists():
        for line in Path(cache_path).read_text().splitlines():
            try:
                rec = json.loads(line)
                cached[rec["key"]] = VariantResult(**rec["result"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut by a kill
    results: dict[int, VariantResult] = {i: cached[k] for i, k in enumerate(keys) if k in cached}
    todo = [i for i in range(len(rows)) if i not in results]
    in_process = workers == 0 or (workers is None and len(todo) <= IN_PROCESS_ROWS)
    chunks = [todo[k:k + 8] for k in range(0, len(todo), 8)]
    # spawned workers: never more than the chunks, none when every row is cached
    n = 0 if in_process else min(len(chunks), workers or max(1, len(os.sched_getaffinity(0))))
    if stats is not None:
        stats.update(cached=len(results), computed=len(todo), workers=n)
    out = open(cache_path, "a") if cache_path is not None else None  # noqa: SIM115 - closed below
    bar = tqdm(total=len(todo), desc="variants", unit="task", disable=not progress)

    def done(i: int, res: VariantResult) -> None:
        results[i] = res
        bar.update(1)
        if out is not None:
            out.write(json.dumps({"key": keys[i], "result": res.__dict__}) + "\n")
            out.flush()

    try:
        if in_process:
            from opforge.seeds.vocabulary import default_vocabulary

            vocab = default_vocabulary()
            for i in todo:
                done(i, shape_variants(rows[i], settings, vocab))
            return [results[i] for i in range(len(rows))]
        if not n:  # every row was cached
            return [results[i] for i in range(len(rows))]
        from pebble import ProcessPool

        with ProcessPool(max_workers=n, initializer=_init_worker,
                         context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.schedule(_unit, ([rows[i] for i in c], settings), timeout=timeout_s): c for c in chunks}
            retry: list[int] = []
            for fut, chunk in futures.items():
                try:
                    for i, res in zip(chunk, fut.result(), strict=True):
                        done(i, res)
                except Exception:  # noqa: BLE001 - a timeout or a dead worker: one row at a time
                    retry += chunk
            singles = {pool.schedule(_unit, ([rows[i]], settings), timeout=timeout_s): i for i in retry}
            for fut, i in singles.items():
                try:
                    done(i, fut.result()[0])
                except TimeoutError:
                    done(i, VariantResult(str(rows[i]["task_id"]), reason="timeout"))
                except Exception as exc:  # noqa: BLE001 - the row killed its worker
                    done(i, VariantResult(str(rows[i]["task_id"]), reason=f"crash:{type(exc).__name__}"))
    finally:
        bar.close()
        if out is not None:
            out.close()
    return [results[i] for i in range(len(rows))]



class VariantPool:
    """``shape_variants`` of rows handed over one by one while something else runs (``opforge run`` computes
    those of accepted tasks while the filter works), in ``workers`` spawned processes kept for the pool's
    life. Each result is appended to the cache file ``cache_path`` under the key ``variants_for_rows`` reads,
    so ``variants_for_rows`` over the same rows and settings later finds it there. A chunk that times out
    (``timeout_s``) or kills its worker is left out: ``variants_for_rows`` computes those rows again.

    Attributes:
        computed: rows whose result was written; ``busy_s``: seconds of the chunks computed (summed over the
        workers); ``first_submit`` / ``last_done``: Unix seconds (None before).
    """

    CHUNK = 8

    def __init__(self, cache_path, settings: VariantSettings | None = None, workers: int = 1,
                 timeout_s: float = 300.0):
        import multiprocessing
        import threading
        from pathlib import Path

        from pebble import ProcessPool

        self.settings = settings or VariantSettings()
        self.path, self.timeout_s = Path(cache_path), timeout_s
        self.known: set[str] = set()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self.known.add(json.loads(line)["key"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a kill
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.path, "a")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._waiting: list[dict[str, Any]] = []
        self._futures: list = []
        self.computed, self.busy_s = 0, 0.0
        self.first_submit: float | None = None
        self.last_done: float | None = None
        self._pool = ProcessPool(max_workers=max(1, workers), initializer=_init_worker,
                                 context=multiprocessing.get_context("spawn"))

    def submit(self, row: Mapping[str, Any], flush: bool = False) -> None:
        """Compute the variants of ``row`` (``task_id``, ``code``, ``size_context``, ``dtype``, ``eager_ms``,
        ``gpu``) unless the cache has them; rows go to the workers ``CHUNK`` at a time (``flush``: now)."""
        key = _cache_key(row, self.settings)
        if key not in self.known:
            self.known.add(key)
            self._waiting.append((key, dict(row)))
        if flush or len(self._waiting) >= self.CHUNK:
            self._send()

    def _send(self) -> None:
        import time

        if not self._waiting:
            return
        chunk, self._waiting = self._waiting, []
        self.first_submit = self.first_submit or time.time()
        fut = self._pool.schedule(_timed_unit, ([r for _, r in chunk], self.settings), timeout=self.timeout_s)
        fut.add_done_callback(lambda f, keys=[k for k, _ in chunk]: self._done(keys, f))
        self._futures.append(fut)

    def _done(self, keys: list[str], fut) -> None:
        import time

        try:
            results, seconds = fut.result()
        except Exception:  # noqa: BLE001 - a timeout, a dead worker or a cancelled chunk: computed again later
            return
        with self._lock:
            if self._out.closed:
                return
            for key, res in zip(keys, results, strict=True):
                self._out.write(json.dumps({"key": key, "result": res.__dict__}) + "\n")
            self._out.flush()
            self.computed += len(results)
            self.busy_s += seconds
            self.last_done = time.time()

    def close(self, wait: bool = True) -> None:
        """Send the rows still waiting and wait for every chunk (``wait``), or stop the workers now."""
        if wait:
            self._send()
            for fut in self._futures:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - nothing written for it: computed again later
                    pass
            self._pool.close()
        else:
            self._pool.stop()
        self._pool.join()
        with self._lock:
            self._out.close()


def _timed_unit(rows: list[dict[str, Any]], settings: VariantSettings) -> tuple[list[VariantResult], float]:
    import time

    t0 = time.perf_counter()
    return _unit(rows, settings), time.perf_counter() - t0

def summary(results: list[VariantResult], settings: VariantSettings | None = None) -> dict[str, Any]:
    """Counts for a report or the data card: tasks, tasks per number of variants kept, tasks with at least
    ``settings.count``, and the reasons of those with fewer."""
    settings = settings or VariantSettings()
    per: dict[int, int] = {}
    reasons: dict[str, int] = {}
    for r in results:
        per[len(r.variants)] = per.get(len(r.variants), 0) + 1
        if len(r.variants) < settings.count and r.reason:
            key = r.reason.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    return {"generator": GENERATOR, "seed": settings.seed, "count": settings.count, "tasks": len(results),
            "with_count": sum(n for k, n in per.items() if k >= settings.count),
            "per_count": {str(k): per[k] for k in sorted(per)}, "reasons": dict(sorted(reasons.items()))}
