"""Model-like sizes for composed tasks: a size context drawn from the shape vocabulary, and the fit of the
batch and one free axis to the runtime window.

Every non-batch size of a fused task comes from one *size context*: one model record of the shape vocabulary
(``opforge.seeds.vocabulary``: a transformers family's default config, or a CNN's channel / feature-map ladder),
read according to the layout of the task's first input:

| layout | context | C (channels) | K (features) | free axis |
|---|---|---|---|---|
| NLC, NC, fixed shapes | sequence | hidden (or intermediate) | hidden, intermediate, vocab, classes | L: seq up to the model's positions |
| NCHW, NHWC | image | a channel of the ladder (3 for a stem) | a neighbouring channel | H = W (mostly): a feature-map size |
| NCL | signal | mel bins, conv channels or hidden | conv channels or hidden | L: frames / seq |
| NCDHW | video | channels <= 512 | channels <= 512 | H = W <= 224, D: frames |

Values the record lacks come from the vocabulary's axis of that name. The batch comes from the ``batch`` axis
(1-512). ``fit_sizes`` then moves the batch, and the free axis when the batch alone cannot, within those values
(never past what the vocabulary holds) until the predicted eager time lies inside the profile's window and the
inputs fit ``input_cap_bytes``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from opforge.compose.device_profiles import DeviceProfile, window_target
from opforge.compose.graphs.cost_model import Cost, graph_cost
from opforge.compose.graphs.graph import OpGraph

SEQ_MAX = 8192  # longest sequence a task uses (long-context positions beyond it are not a fusion problem)
SEQ_MIN = 16


class SizingError(Exception):
    """No vocabulary sizes put the task inside the window (too fast at the largest, too slow at the smallest)."""


@dataclass
class SizeContext:
    """Sizes of one task, all from one vocabulary record.

    Attributes:
        family: the record's family (``llama``, ``resnet50``...), kept in the task's provenance.
        kind: ``sequence``, ``image``, ``signal`` or ``video``.
        values: size symbol (``C``, ``K``, ``L``, ``H``, ``W``, ``D``) -> value.
        k_options: values an op's free output size ``K`` may take.
        knobs: size-constant names (``seq_len``, ``height+width``, ``depth``) -> allowed values, sorted; the
            free axes ``fit_sizes`` may move.
    """

    family: str
    kind: str
    values: dict[str, int]
    k_options: list[int]
    knobs: dict[str, list[int]] = field(default_factory=dict)


def _ints(v) -> list[int]:
    if v is None:
        return []
    vals = v if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in vals if isinstance(x, (int, float)) and int(x) > 0]


def _axis(vocab, axis: str, lo: int = 1, hi: int | None = None) -> list[int]:
    return list(vocab.values(axis, lo, hi))


def _pick(rng: random.Random, values: list[int], fallback: list[int]) -> int:
    return rng.choice(values or fallback)


_RECORDS: dict[tuple, tuple] = {}  # (id(vocab), keys) -> (vocab, its records with one of the keys)


def _records(vocab, *keys: str) -> list[dict]:
    """The model records of ``vocab`` that have a value for one of ``keys`` (computed once per vocabulary;
    the list is shared: do not modify it)."""
    hit = _RECORDS.get((id(vocab), keys))
    if hit is None or hit[0] is not vocab:
        if len(_RECORDS) >= 16:
            _RECORDS.clear()
        hit = (vocab, [m for m in vocab.models if any(_ints(m.get(k)) for k in keys)])
        _RECORDS[(id(vocab), keys)] = hit
    return hit[1]


def layout_kind(layout: list | str | None) -> str:
    """``sequence`` / ``image`` / ``signal`` / ``video`` for a template name (``NCHW``...) or a shape."""
    name = layout if isinstance(layout, str) else ""
    return {"NCHW": "image", "NHWC": "image", "NCL": "signal", "NCDHW": "video"}.get(name, "sequence")


def draw_context(vocab, kind: str, rng: random.Random) -> SizeContext:
    """A size context of ``kind`` from one model record of ``vocab`` (see the module doc).

    Raises SizingError when the vocabulary has no record or values for ``kind``."""
    if kind == "sequence":
        return _sequence(vocab, rng)
    if kind == "image":
        return _image(vocab, rng)
    if kind == "signal":
        return _signal(vocab, rng)
    if kind == "video":
        return _video(vocab, rng)
    raise ValueError(f"unknown size-context kind {kind!r}")


def _seq_options(vocab, longest: int | None) -> list[int]:
    hi = min(SEQ_MAX, longest or SEQ_MAX)
    return _axis(vocab, "seq", SEQ_MIN, hi) or _axis(vocab, "seq", SEQ_MIN, SEQ_MAX)


MIN_HIDDEN = 128  # smaller hidden sizes in default configs are toy / test configs, not deployed models


def _sequence(vocab, rng) -> SizeContext:
    recs = [m for m in _records(vocab, "hidden") if _ints(m.get("hidden"))[0] >= MIN_HIDDEN]
    if not recs:
        raise SizingError("the shape vocabulary has no model with a hidden size")
    r = rng.choice(recs)
    hidden = _ints(r.get("hidden"))[0]
    inter = (_ints(r.get("intermediate")) or [_pick(rng, _axis(vocab, "intermediate", hidden, 8 * hidden), [hidden])])[0]
    seq = _seq_options(vocab, (_ints(r.get("seq")) or [None])[0])
    k_opts = [hidden, hidden, inter, inter]
    extra = _ints(r.get("vocab")) + _ints(r.get("classes"))
    if extra and rng.random() < 0.3:
        k_opts.append(rng.choice(extra))
    values = {"C": hidden if rng.random() < 0.75 else inter, "L": rng.choice(seq)}
    heads = (_ints(r.get("heads")) or [0])[0]
    head_dim = (_ints(r.get("head_dim")) or [0])[0]
    if heads and head_dim:
        values.update({"A": heads, "E": head_dim})
    return SizeContext(r.get("family", "?"), "sequence", values, k_opts, {"seq_len": seq})


def _ladder(vocab, r: dict, hi: int | None = None) -> list[int]:
    """The record's channel ladder without input channels (<= 4: RGB / RGBA stems are drawn separately)."""
    ch = [c for c in _ints(r.get("channels")) if c > 4 and (hi is None or c <= hi)]
    return ch or _axis(vocab, "channels", 5, hi)


def _image(vocab, rng) -> SizeContext:
    recs = _records(vocab, "channels", "spatial")
    r = rng.choice(recs) if recs else {}
    ladder = _ladder(vocab, r)
    spatial_all = _axis(vocab, "spatial", 4, 512)
    spatial = [s for s in _ints(r.get("spatial")) if s <= 512] or spatial_all
    if not ladder or not spatial_all:
        raise SizingError("the shape vocabulary has no channel ladder or spatial sizes")
    i = rng.randrange(len(ladder))
    stem = rng.random() < 0.1 and 3 in _axis(vocab, "channels")
    c = 3 if stem else ladder[i]
    neighbours = ladder[:2] if stem else [ladder[j] for j in (i - 1, i, i + 1) if 0 <= j < len(ladder)]
    h = rng.choice(spatial)
    w = h if rng.random() < 0.85 else rng.choice(spatial_all)
    return SizeContext(r.get("family", "vocabulary"), "image", {"C": c, "H": h, "W": w},
                       [k for k in neighbours + [ladder[i]] if k > 3] or [64], {"height+width": spatial_all})


def _signal(vocab, rng) -> SizeContext:
    recs = _records(vocab, "mel", "channels", "hidden")
    r = rng.choice(recs) if recs else {}
    cs = _ints(r.get("mel")) + _ladder(vocab, r, 4096) + _ints(r.get("hidden"))
    seq = _seq_options(vocab, 16384)
    c = rng.choice(cs or _axis(vocab, "channels", 1, 4096))
    k_opts = [x for x in cs if x > 3] or [c]
    return SizeContext(r.get("family", "vocabulary"), "signal", {"C": c, "L": rng.choice(seq)}, k_opts,
                       {"seq_len": seq})


def _video(vocab, rng) -> SizeContext:
    recs = _records(vocab, "depth")
    r = rng.choice(recs) if recs else {}
    ladder = _ladder(vocab, r, 512) or [c for c in _axis(vocab, "channels") if c <= 512]
    spatial = _axis(vocab, "spatial", 4, 224)
    depth = _axis(vocab, "depth", 2, 64) or [8, 16]
    if not ladder or not spatial:
        raise SizingError("the shape vocabulary has no channels or spatial sizes for video")
    c = 3 if rng.random() < 0.2 and 3 in _axis(vocab, "channels") else rng.choice(ladder)
    h = rng.choice(spatial)
    return SizeContext(r.get("family", "vocabulary"), "video",
                       {"C": c, "H": h, "W": h, "D": rng.choice(depth)}, ladder,
                       {"height+width": spatial, "depth": depth})


# ---- fitting the window ----

def _set(sizes: dict[str, int], knob: str, value: int) -> dict[str, int]:
    out = dict(sizes)
    for name in knob.split("+"):
        if name in out:
            out[name] = value
    return out


def _try_cost(graph: OpGraph, sizes: dict[str, int], memo: dict | None = None) -> Cost | None:
    """``graph_cost`` at ``sizes``, None when an op refuses them; ``memo`` (sizes -> result) holds the costs of
    one unchanged graph, so a size assignment tried again is not run again."""
    key = tuple(sorted(sizes.items()))
    if memo is not None and key in memo:
        return memo[key]
    try:
        out = graph_cost(graph, sizes)
    except Exception:  # noqa: BLE001 - an op that refuses these sizes: the option is infeasible
        out = None
    if memo is not None:
        memo[key] = out
    return out


def fit_sizes(graph: OpGraph, profile: DeviceProfile, batches: list[int], knobs: dict[str, list[int]],
              batch_name: str = "batch_size", max_steps: int = 8) -> tuple[dict[str, int], float]:
    """Sizes (``graph.sizes`` updated) whose predicted eager time lies in ``profile.window_ms`` shrunk by
    ``window_margin``, nearest its log-midpoint, with inputs within ``input_cap_bytes``, every tensor within
    ``memory_cap_bytes`` and no op above ``max_op_share`` of the time (multi-op graphs). The batch moves first (time and bytes are close to linear in it); when even the
    largest admissible batch is too fast (or batch 1 too slow) a free axis of ``knobs`` moves one value up (or
    down) and the batch is chosen again. Returns (sizes, predicted ms).

    Raises SizingError when no values of ``batches`` and ``knobs`` fit.
    """
    ok_lo, ok_hi, target = window_target(profile)
    sizes = dict(graph.sizes)
    batches = sorted(set(batches))
    memo: dict = {}  # the graph does not change here: each size assignment is costed once
    for _ in range(max_steps):
        c = _try_cost(graph, sizes, memo)
        if c is None:
            raise SizingError("the graph does not run at its sizes")
        b0 = sizes.get(batch_name, 1)
        ovh = c.n_ops * profile.launch_overhead_ms
        per = max(c.predict_ms(profile) - ovh, 0.0) / b0

        def admissible(b, c=c, b0=b0):
            return c.input_bytes * b / b0 <= profile.input_cap_bytes and c.peak_bytes * b / b0 <= profile.memory_cap_bytes

        options = [b for b in batches if admissible(b)] if batch_name in sizes else [b0]
        if not options:
            move = -1  # even batch 1 holds too much: shrink a free axis
        else:
            best = min(options, key=lambda b: abs(math.log(max(per * b + ovh, 1e-9) / target)))
            t = per * best + ovh
            if ok_lo <= t <= ok_hi:
                trial = {**sizes, batch_name: best} if batch_name in sizes else sizes
                final = _try_cost(graph, trial, memo)
                if final is not None and ok_lo <= final.predict_ms(profile) <= ok_hi \
                        and final.input_bytes <= profile.input_cap_bytes \
                        and final.peak_bytes <= profile.memory_cap_bytes:
                    if final.n_ops > 1 and final.dominant_share(profile) > profile.max_op_share:
                        raise SizingError(f"one op takes {final.dominant_share(profile):.1%} of the predicted time")
                    graph.sizes = trial
                    return trial, final.predict_ms(profile)
                # not linear after all: move the batch to what the exact cost says and try again
                sizes = trial
                continue
            move = 1 if t < ok_lo else -1
            sizes = {**sizes, batch_name: best} if batch_name in sizes else sizes
        moved = False
        for knob, values in knobs.items():
            if any(name in graph.frozen for name in knob.split("+")):
                continue
            current = sizes.get(knob.split("+")[0])
            if current is None or not values:
                continue
            cand = [v for v in values if (v > current if move > 0 else v < current)]
            if not cand:
                continue
            nxt = min(cand) if move > 0 else max(cand)
            trial = _set(sizes, knob, nxt)
            if _try_cost(graph, trial, memo) is not None:
                sizes, moved = trial, True
                break
        if not moved:
            raise SizingError(f"no vocabulary size brings the predicted time into "
                              f"[{ok_lo:g}, {ok_hi:g}] ms ({'too fast' if move > 0 else 'too slow or too large'})")
    raise SizingError("sizes did not converge")
