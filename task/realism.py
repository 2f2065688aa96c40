"""Realism figures of a set of KernelBench-format tasks, measured on the ``meta`` device.

Measures the figures of issue #20 ("Must show") for composer candidates, a published Hugging Face dataset
folder or CUDA-Agent-Ops-6K, so that they can be compared with the issue's targets. ``opforge compare``
(``opforge.pipeline.compare``) reports them for two datasets side by side; ``benchmarks/realism_bench.py``
measures one dataset with a per-row cache.

Library use::

    rows = read_rows(Path("runs/x/hf"))              # Parquet / JSONL file or folder with data/*.parquet
    records, cached = measure_with_cache(rows, Path("runs/realism_cache.jsonl"), workers=2)
    figures = summarise(records)
    print(format_table([{"input": {"path": "runs/x/hf"}, "figures": figures, "targets": check_targets(figures)}]))

The only column required is ``code``; ``ops`` (op labels), ``data_source``, ``task_id`` and ``dtype`` are used
when present.

What one row costs: the task source is executed (``opforge.task.source.load_task``), then, under
``torch.device("meta")`` (no memory, no compute), ``get_inputs()`` and ``Model(*get_init_inputs())`` are
built and one forward is traced (``opforge.task.trace.trace_ops``, canonical op names). Rows run in worker
processes with a per-row timeout and an address-space cap; a row that fails to load, build or trace, runs
out of time or kills its worker is counted under its status, never stops the run. Per-row records are
cached in a JSONL file keyed by the SHA-256 of the row's code, labels, data source, ``MEASURE_VERSION`` and
the torch / transformers versions, so an interrupted run resumes.

Rules of the figures (each a number in the JSON result):

* **batch**: dim 0 of the first tensor that ``get_inputs()`` returns (lists / tuples are flattened in
  order); none when that tensor has fewer than 2 dims. p50, p90 and the share of tasks with batch > 8,192
  are over tasks that have a batch.
* **non-batch dims**: dims 1.. of every input tensor (a 0-D or 1-D input has none). ``largest_non_batch_p50``
  is the median over tasks of each task's largest one. ``distinct_non_batch_dims`` counts the distinct
  values over all measured tasks; since it grows with the number of tasks, ``distinct_non_batch_dims_500``
  gives the same count on a fixed random sample of 500 measured tasks (``random.Random(0)``).
* **non-multiple of 8**: a task counts when any of its inputs' non-batch dims, or any ``in_features`` /
  ``out_features`` of an ``nn.Linear`` / ``nn.Bilinear`` (``in1`` / ``in2``) or ``in_channels`` /
  ``out_channels`` of an ``nn.Conv*`` / ``nn.ConvTranspose*`` in the model, is > 1 and not a multiple of 8
  (dims of size 1 are broadcast dims, not tiles).
* **fp16 / bf16**: a task counts when an input tensor, a parameter or a buffer of the model built from
  ``get_init_inputs()`` is ``float16`` or ``bfloat16`` (casts made inside ``forward`` are not seen).
* **input bytes**: sum of ``numel * element_size`` over the input tensors; p50 and p95, 1 GB = 10^9 bytes.
* **op shares**: over tasks whose forward traced; a task contains an op when one of its traced calls has
  that canonical name (``opforge.task.op_names``: ``torch.relu`` / ``F.relu`` / ``nn.ReLU`` are ``relu``,
  ``mm`` / ``bmm`` are ``matmul``; a torch.nn module contributes the functions it calls, without the
  tensor creation / layout helpers of ``MODULE_HELPERS`` such as nn.LSTM's ``zeros``). A heavy op is a
  GEMM (``GEMM_OPS``: linear, bilinear, matmul / mm / bmm, addmm, addbmm, baddbmm, einsum, tensordot,
  chain_matmul, multi_dot), a convolution (``CONV_PATTERN``: conv1d/2d/3d, conv_transpose1d/2d/3d,
  conv_tbc, convolution), attention (``ATTENTION_OPS``: scaled_dot_product_attention,
  multi_head_attention_forward) or recurrent (``RNN_OPS``: lstm, gru, rnn_tanh, rnn_relu and their
  ``*_cell`` forms).
* **diversity of multi-op rows** (``op_kind``, over traced tasks): each canonical op name is a *layout* op
  (``LAYOUT_OPS``: view / reshape, permute, transpose, contiguous, flatten, unflatten, squeeze, unsqueeze,
  expand, chunk / split, narrow, getitem, dtype casts), a *common* op (``COMMON_OPS``: add, sub, mul, div,
  matmul, linear, conv2d), a *building block* (``BUILDING_BLOCKS``: the layer / batch / group / RMS /
  instance norms, softmax, log_softmax, relu, gelu, silu, sigmoid, tanh, hardswish, hardsigmoid, relu6
  (traced as hardtanh), mish, leaky_relu, elu, pooling (``POOL_PATTERN``), mean, sum, bmm, cat, conv1d, conv3d, sqrt, rsqrt, exp,
  pow, neg) or *exotic* (any other op). A task's *op set* is its op names without the layout ones.
  ``top_exotic_op`` / ``top_exotic_op_share``: the exotic op in the most tasks and its share;
  ``top_op_set`` / ``top_op_set_share``: the op set shared by the most tasks (names joined by `` + ``;
  ``(layout only)`` for a task of layout ops) and its share; ``distinct_op_sets`` and
  ``distinct_op_set_share``: the number of distinct op sets and that number over the traced tasks. Why:
  rows cut from real models carry layout ops and standard building blocks in most blocks, so a per-op bound
  on them would measure the models, not the dataset; what makes the dataset one kernel written many times is
  one unusual op everywhere or one op combination repeated, which the bounds on exotic ops and op sets catch.
* **internal ATen-level names**: a task counts when an op label (``ops`` column) or a name the code calls
  or imports (``torch.X``, ``F.X``, ``Tensor`` methods ``.X(``, ``from torch... import X``) matches
  ``native_*``, ``*_copy`` (except the public ``index_copy``), ``*_with_indices``, ``constant_pad_nd``,
  ``slice_inverse``, or is a private ``torch._X`` / ``torch.ops.`` call. Over all rows (static, no load
  needed).
* **transformers imports**: over rows with ``data_source == "transformers"``: the share whose code refers
  to ``transformers.models`` (``from transformers.models... import`` or the attribute path), and the share
  that imports ``transformers`` at all (anywhere in the source).

Targets (``TARGETS``) are those of issue #20, "Must show", for 2,000 candidates of the new composer, with the
bound on single ops replaced for multi-op rows by issue #60's diversity rule: any exotic op in at most 8 % of the
tasks, any op set in at most 2 %, distinct op sets at least 20 % of the tasks.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import sys
import time
from collections import Counter
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any

MEASURE_VERSION = 2

# Canonical op names (opforge.task.op_names) that count as a heavy call. mm / bmm are canonicalised to
# matmul; addmm / baddbmm / addbmm are GEMMs with an added term; einsum / tensordot / bilinear /
# multi_dot contract like a GEMM. Modules contribute the functions they call (nn.MultiheadAttention calls
# multi_head_attention_forward, nn.LSTM calls lstm); the *_cell and bare rnn names come from cell modules
# and from module classes that called no traceable function.
GEMM_OPS = frozenset({"linear", "bilinear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "einsum",
                      "tensordot", "chain_matmul", "linalg_multi_dot", "multi_dot"})
CONV_PATTERN = re.compile(r"^(conv\d?d|conv_transpose\d?d|conv_tbc|convolution|_convolution)$")
ATTENTION_OPS = frozenset({"scaled_dot_product_attention", "multi_head_attention_forward",
                           "multihead_attention", "multi_head_attention"})
RNN_OPS = frozenset({"lstm", "gru", "rnn", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_cell",
                     "rnn_tanh_cell", "rnn_relu_cell"})
COMMON_OPS = frozenset({"add", "sub", "mul", "div", "matmul", "linear", "conv2d"})
# Diversity of multi-op rows (issue #60). Layout ops move or re-type data without computing: they do not count.
# Canonical names (opforge.task.op_names) and the spellings a label may keep (view / flatten / chunk are
# canonicalised to reshape / reshape / split, but labels of other sources may carry them).
LAYOUT_OPS = frozenset({"view", "view_as", "reshape", "reshape_as", "permute", "transpose", "contiguous", "flatten",
                        "unflatten", "squeeze", "unsqueeze", "expand", "expand_as", "chunk", "split", "narrow",
                        "getitem", "to", "type", "type_as", "float", "double", "half", "bfloat16"})
# Standard building blocks of model blocks: they may recur in any share of the rows.
BUILDING_BLOCKS = frozenset({"layer_norm", "batch_norm", "group_norm", "rms_norm", "instance_norm", "softmax",
                             "log_softmax", "relu", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid",
                             "relu6", "hardtanh", "mish", "leaky_relu", "elu", "mean", "sum", "bmm", "cat", "conv1d",
                             "conv3d", "sqrt", "rsqrt", "exp", "pow", "neg"})  # nn.ReLU6 / F.relu6 trace as hardtanh
POOL_PATTERN = re.compile(r"^(adaptive_)?(max|avg|lp)_pool[123]d$")
_DIM_SUFFIX = re.compile(r"^((?:batch|instance)_norm)[123]d$")  # nn.BatchNorm2d is the functional batch_norm
# label spellings op_names.label_op keeps (symbols; ``nn.SiLU`` snake-cased as ``si_lu``) -> canonical names
_SYMBOL_NAMES = {"-x": "neg", "**": "pow", "[]": "getitem", "si_lu": "silu"}
# Tensor creation and layout calls a torch.nn module makes around its computation (nn.LSTM creates its
# zero initial state, nn.MultiheadAttention transposes batch_first inputs): not counted as the module's
# ops unless they are all it calls.
MODULE_HELPERS = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
                            "full_like", "transpose", "permute", "reshape", "unsqueeze", "squeeze",
                            "expand", "contiguous", "split", "unbind", "select", "narrow", "movedim"})

# Internal ATen-level names (issue #20): checked on op labels and on names the code calls or imports.
_INTERNAL_NAME = re.compile(r"^(native_\w+|\w+_copy|\w+_with_indices|constant_pad_nd|slice_inverse)$")
_PUBLIC_COPY = frozenset({"index_copy"})
_CODE_CALL = re.compile(r"(?:\btorch(?:\.nn\.functional)?|\bF|\bTensor)\.(\w+)|\.(\w+)\s*\(")
_CODE_IMPORT = re.compile(r"^\s*from\s+torch[\w.]*\s+import\s+\(?([^)\n]+)", re.M)
_PRIVATE_TORCH = re.compile(r"\btorch\._[A-Za-z]\w*|\btorch\.ops\.\w+")
_TF_MODELS = re.compile(r"\btransformers\.models\b")
_TF_ANY = re.compile(r"^\s*(?:from\s+transformers\b[\w.]*\s+import|import\s+transformers\b)", re.M)

ONE_GB = 10**9
# (figure key, target text, test). From issue #20, "Must show"; the three diversity bounds from issue #60.
TARGETS: list[tuple[str, str, Any]] = [
    ("batch_p50", "<= 512", lambda v: v <= 512),
    ("batch_share_gt_8192", "<= 5 %", lambda v: v <= 0.05),
    ("largest_non_batch_p50", ">= 256", lambda v: v >= 256),
    ("heavy_op_share", ">= 45 %", lambda v: v >= 0.45),
    ("conv_share", ">= 15 %", lambda v: v >= 0.15),
    ("top_exotic_op_share", "<= 8 %", lambda v: v <= 0.08),
    ("top_op_set_share", "<= 2 %", lambda v: v <= 0.02),
    ("distinct_op_set_share", ">= 20 %", lambda v: v >= 0.20),
    ("internal_name_share", "<= 1 %", lambda v: v <= 0.01),
    ("low_precision_share", ">= 20 %", lambda v: v >= 0.20),
    ("non_multiple_of_8_share", ">= 15 %", lambda v: v >= 0.15),
    ("distinct_non_batch_dims", ">= 150", lambda v: v >= 150),
    ("input_bytes_p95", "<= 1 GB", lambda v: v <= ONE_GB),
    ("transformers_models_import_share", "0 %", lambda v: v == 0),
]


# ---------------------------------------------------------------------------------------------------------
# static checks (no torch)


def op_labels(ops: Any) -> list[str]:
    """The row's ``ops`` value as a list of labels: a JSON list, or one bare label (a transformers
    module's class name, Ops-6K writes ``Name_k``); ``[]`` when absent."""
    if ops is None or (isinstance(ops, float) and math.isnan(ops)):
        return []
    if isinstance(ops, (list, tuple)):
        return [str(o) for o in ops]
    text = str(ops).strip()
    if text.startswith("["):
        try:
            return [str(o) for o in json.loads(text)]
        except json.JSONDecodeError:
            return [text]
    return [text] if text else []


def _is_internal(name: str) -> bool:
    return bool(_INTERNAL_NAME.match(name)) and name.rstrip("_") not in _PUBLIC_COPY


def internal_names(code: str, labels: list[str]) -> list[str]:
    """Internal ATen-level names found in ``labels`` (``torch.native_layer_norm``: the part after the
    last dot is checked) and in what ``code`` calls or imports from torch; sorted, de-duplicated.
    The rule is in the module docstring."""
    found = {lab for lab in labels if _is_internal(lab.rsplit(".", 1)[-1])}
    for m in _CODE_CALL.finditer(code):
        name = m.group(1) or m.group(2)
        if _is_internal(name):
            found.add(name)
    for m in _CODE_IMPORT.finditer(code):
        for part in m.group(1).split(","):
            name = part.strip().split(" as ")[0].strip()
            if name and _is_internal(name):
                found.add(name)
    found.update(m.group(0) for m in _PRIVATE_TORCH.finditer(code))
    return sorted(found)


def transformers_imports(code: str) -> tuple[bool, bool]:
    """``(refers to transformers.models, imports transformers at all)`` for one task source."""
    return bool(_TF_MODELS.search(code)), bool(_TF_ANY.search(code))


def op_kind(op: str) -> str:
    """The diversity class of a canonical op name (module docstring): ``layout``, ``common``, ``block`` or
    ``exotic``. A module's dimension suffix is dropped first (``batch_norm2d`` is ``batch_norm``)."""
    op = _DIM_SUFFIX.sub(r"\1", _SYMBOL_NAMES.get(op, op))
    if op in LAYOUT_OPS:
        return "layout"
    if op in COMMON_OPS:
        return "common"
    if op in BUILDING_BLOCKS or POOL_PATTERN.match(op):
        return "block"
    return "exotic"


def op_set(ops) -> frozenset[str]:
    """A task's op set: its canonical op names without the layout ones (``op_kind``), dimension suffixes
    dropped."""
    return frozenset(_DIM_SUFFIX.sub(r"\1", _SYMBOL_NAMES.get(o, o)) for o in ops if op_kind(o) != "layout")


def exotic_ops(ops) -> frozenset[str]:
    """The exotic ops (``op_kind``) among a task's canonical op names."""
    return frozenset(o for o in op_set(ops) if op_kind(o) == "exotic")


def op_set_name(ops: frozenset[str]) -> str:
    """An op set as the figures name it: sorted names joined by `` + ``; ``(layout only)`` when empty."""
    return " + ".join(sorted(ops)) or "(layout only)"


def diversity(op_lists: list) -> dict[str, Any]:
    """The diversity figures (module docstring) of tasks given as lists of canonical op names: ``top_exotic_op``,
    ``top_exotic_op_share``, ``top_op_set``, ``top_op_set_share``, ``distinct_op_sets``,
    ``distinct_op_set_share`` (shares over ``len(op_lists)``; None when it is 0). Ties go to the smaller name."""
    n = len(op_lists)
    if not n:
        return {"top_exotic_op": None, "top_exotic_op_share": None, "top_op_set": None, "top_op_set_share": None,
                "distinct_op_sets": 0, "distinct_op_set_share": None}
    sets = [op_set(ops) for ops in op_lists]
    exotic = Counter(o for s in sets for o in s if op_kind(o) == "exotic")
    top_op = min(exotic.items(), key=lambda kv: (-kv[1], kv[0]), default=None)
    by_set = Counter(op_set_name(s) for s in sets)
    top_set = min(by_set.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"top_exotic_op": top_op[0] if top_op else None, "top_exotic_op_share": top_op[1] / n if top_op else 0.0,
            "top_op_set": top_set[0], "top_op_set_share": top_set[1] / n,
            "distinct_op_sets": len(by_set), "distinct_op_set_share": len(by_set) / n}


def is_heavy(op: str) -> str | None:
    """The heavy class of a canonical op name (``gemm``, ``conv``, ``attention``, ``rnn``) or None."""
    if op in GEMM_OPS:
        return "gemm"
    if CONV_PATTERN.match(op):
        return "conv"
    if op in ATTENTION_OPS:
        return "attention"
    if op in RNN_OPS:
        return "rnn"
    return None


# ---------------------------------------------------------------------------------------------------------
# one row, on meta


def _feature_sizes(model) -> list[int]:
    import torch

    sizes: list[int] = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            sizes += [mod.in_features, mod.out_features]
        elif isinstance(mod, torch.nn.Bilinear):
            sizes += [mod.in1_features, mod.in2_features, mod.out_features]
        elif isinstance(mod, torch.nn.modules.conv._ConvNd):
            sizes += [mod.in_channels, mod.out_channels]
    return [int(s) for s in sizes]


def task_ops(traced: list) -> set[str]:
    """Canonical op names of a traced forward (``opforge.task.trace.TracedOp`` list): every function call's
    name, and for a torch.nn module call its names minus ``MODULE_HELPERS`` (all of them when nothing
    else is left)."""
    names: set[str] = set()
    for op in traced:
        own = set(op.canonical)
        if op.kind == "module" and own - MODULE_HELPERS:
            own -= MODULE_HELPERS
        names |= own
    return names


def measure_row(row: dict[str, Any]) -> dict[str, Any]:
    """Measure one task on the ``meta`` device.

    Args:
        row: ``code`` (task source) and optionally ``ops`` (labels), ``data_source``, ``task_id``, ``dtype``.

    Returns:
        A record: ``status`` (``ok``; ``load_error`` / ``inputs_error`` / ``build_error`` when the source,
        ``get_inputs()`` or the model failed; ``trace_error`` when only the forward failed, shapes and dtypes
        are then kept), ``error`` (type and message), ``input_shapes`` (list of int lists), ``input_dtypes``
        (dtype names), ``input_bytes`` (int, bytes), ``param_dtypes`` (dtype names of parameters and
        buffers), ``feature_sizes`` (Linear / Conv feature sizes), ``ops`` (sorted canonical names or None),
        ``internal`` (internal ATen-level names), ``tf_models`` / ``tf_any`` (transformers imports),
        ``data_source`` and ``declared_dtype`` (the row's ``dtype`` column or None). Never raises for a
        bad task.
    """
    import warnings

    import torch
    from opforge.task.source import flatten_tensors, load_task
    from opforge.task.trace import trace_ops

    code = row.get("code") if isinstance(row.get("code"), str) else ""
    rec = measure_static(row)
    name = rec["name"]

    def fail(status: str, exc: BaseException) -> dict[str, Any]:
        rec["status"] = status
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return rec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            task = load_task(code, name)
        except (Exception, SystemExit) as exc:
            return fail("load_error", exc)
        try:
            with torch.device("meta"):
                inputs = task.inputs()
        except (Exception, SystemExit) as exc:
            return fail("inputs_error", exc)
        tensors = flatten_tensors(inputs)
        rec["input_shapes"] = [list(map(int, t.shape)) for t in tensors]
        rec["input_dtypes"] = [str(t.dtype).removeprefix("torch.") for t in tensors]
        rec["input_bytes"] = int(sum(t.numel() * t.element_size() for t in tensors))
        try:
            with torch.device("meta"):
                model = task.build()
            model.eval()
        except (Exception, SystemExit) as exc:
            return fail("build_error", exc)
        state = [*model.parameters(), *model.buffers()]
        rec["param_dtypes"] = sorted({str(t.dtype).removeprefix("torch.") for t in state})
        rec["feature_sizes"] = _feature_sizes(model)
        try:
            rec["ops"] = sorted(task_ops(trace_ops(model, inputs)))
        except (Exception, SystemExit) as exc:
            return fail("trace_error", exc)
    return rec


# ---------------------------------------------------------------------------------------------------------
# figures


def _pct(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def batch_of(shapes: list[list[int]]) -> int | None:
    """Dim 0 of the first input tensor, or None when there is none or it has fewer than 2 dims."""
    if not shapes or len(shapes[0]) < 2:
        return None
    return shapes[0][0]


def non_batch_dims(shapes: list[list[int]]) -> list[int]:
    """Dims 1.. of every input shape (0-D and 1-D inputs contribute none)."""
    return [d for s in shapes for d in s[1:]]


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures (module docstring) of a list of ``measure_row`` records.

    Shares are fractions in [0, 1], byte figures are bytes; a figure with no task to measure is None.
    ``n_*`` keys give each figure's denominator.
    """
    built = [r for r in records if r["input_shapes"] is not None and r["param_dtypes"] is not None]
    traced = [r for r in records if r["ops"] is not None]
    status = Counter(r["status"] for r in records)
    out: dict[str, Any] = {"rows": len(records), "status": dict(sorted(status.items())),
                           "n_built": len(built), "n_traced": len(traced)}
    # shapes
    batches = [b for r in built if (b := batch_of(r["input_shapes"])) is not None]
    out["n_with_batch"] = len(batches)
    out["batch_p50"] = _pct(batches, 50)
    out["batch_p90"] = _pct(batches, 90)
    out["batch_share_gt_8192"] = _share([b > 8192 for b in batches])
    largest = [max(d) for r in built if (d := non_batch_dims(r["input_shapes"]))]
    out["n_with_non_batch_dim"] = len(largest)
    out["largest_non_batch_p50"] = _pct(largest, 50)
    out["distinct_non_batch_dims"] = len({d for r in built for d in non_batch_dims(r["input_shapes"])})
    sample = random.Random(0).sample(built, min(500, len(built)))
    out["distinct_non_batch_dims_500"] = len({d for r in sample for d in non_batch_dims(r["input_shapes"])})
    out["non_multiple_of_8_share"] = _share([
        any(d > 1 and d % 8 for d in non_batch_dims(r["input_shapes"]) + r["feature_sizes"]) for r in built])
    low = {"float16", "bfloat16"}
    out["low_precision_share"] = _share([bool(low & {*r["input_dtypes"], *r["param_dtypes"]}) for r in built])
    out["input_bytes_p50"] = _pct([r["input_bytes"] for r in built], 50)
    out["input_bytes_p95"] = _pct([r["input_bytes"] for r in built], 95)
    declared = [r for r in built if r["declared_dtype"]]
    if declared:
        out["declared_dtype_counts"] = dict(Counter(r["declared_dtype"] for r in declared))
    # ops
    classes = [{is_heavy(o) for o in r["ops"]} - {None} for r in traced]
    out["heavy_op_share"] = _share([bool(c) for c in classes])
    for kind in ("gemm", "conv", "attention", "rnn"):
        out[f"{kind}_share"] = _share([kind in c for c in classes])
    counts = Counter(o for r in traced for o in r["ops"])
    n = len(traced)
    top = counts.most_common()
    out["top20_ops"] = [[op, c / n] for op, c in top[:20]]
    out.update(diversity([r["ops"] for r in traced]))
    out["distinct_ops"] = len(counts)
    # static: internal names over all rows, transformers imports over transformers rows
    out["internal_name_share"] = _share([bool(r["internal"]) for r in records])
    internal = Counter(x for r in records for x in r["internal"])
    out["internal_names_top"] = internal.most_common(10)
    tf = [r for r in records if r["data_source"] == "transformers"]
    out["n_transformers"] = len(tf)
    out["transformers_models_import_share"] = _share([r["tf_models"] for r in tf])
    out["transformers_any_import_share"] = _share([r["tf_any"] for r in tf])
    errors = Counter((r["status"], (r["error"] or "").split(":")[0]) for r in records if r["status"] != "ok")
    out["error_types"] = [[s, e, c] for (s, e), c in errors.most_common(15)]
    return out


def _by_source(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records split into ``torch`` (``data_source`` ``torch#k``) and ``transformers`` rows (empty parts
    dropped)."""
    parts = {"torch": [r for r in records if str(r["data_source"]).startswith("torch")],
             "transformers": [r for r in records if r["data_source"] == "transformers"]}
    return {k: v for k, v in parts.items() if v}


def check_targets(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{figure: {value, target, pass}}`` for every ``TARGETS`` entry (pass None when the value is None)."""
    out = {}
    for key, text, test in TARGETS:
        v = figures.get(key)
        out[key] = {"value": v, "target": text, "pass": None if v is None else bool(test(v))}
    return out


# ---------------------------------------------------------------------------------------------------------
# worker processes with a per-row timeout


_WARM_UP = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return []
"""


def _worker_main(conn, memory_gib: float) -> None:
    import resource

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import torch

    torch.set_num_threads(1)
    import opforge.task.trace  # noqa: F401 - import before capping the address space

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    cap = vm + int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    measure_row({"code": _WARM_UP})  # first-call costs (op label index, lazy imports) before any timeout
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(measure_row(job))
        except MemoryError:
            conn.send({"status": "oom", "error": "MemoryError"})


class _Worker:
    def __init__(self, ctx, memory_gib: float):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, memory_gib), daemon=True)
        self.proc.start()
        child.close()
        self.job: tuple[int, dict] | None = None
        self.started = 0.0
        self.ready = False

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _failure(row: dict[str, Any], status: str, error: str) -> dict[str, Any]:
    rec = measure_static(row)
    rec.update(status=status, error=error)
    return rec


def measure_static(row: dict[str, Any]) -> dict[str, Any]:
    """The record of a row that could not be measured: only the static figures are filled."""
    code = row.get("code") if isinstance(row.get("code"), str) else ""
    tf_models, tf_any = transformers_imports(code)
    declared = row.get("dtype")
    return {"name": str(row.get("task_id") or row.get("name") or "<row>"), "data_source": row.get("data_source"),
            "status": "ok", "error": None, "input_shapes": None, "input_dtypes": None, "input_bytes": None,
            "param_dtypes": None, "feature_sizes": None, "ops": None,
            "internal": internal_names(code, op_labels(row.get("ops"))), "tf_models": tf_models,
            "tf_any": tf_any, "declared_dtype": declared if isinstance(declared, str) else None}


def measure_rows(rows: list[dict[str, Any]], workers: int = 2, timeout_s: float = 60.0,
                 memory_gib: float = 4.0, progress: bool = True) -> list[dict[str, Any]]:
    """``measure_row`` over ``rows`` in ``workers`` spawned processes; a row that runs past ``timeout_s``
    seconds becomes a ``timeout`` record and one whose worker dies a ``crash`` record (the worker is
    replaced). Each worker's address space is capped at its start-up size + ``memory_gib`` GiB.
    Returns records in the order of ``rows``."""
    from tqdm import tqdm

    ctx = multiprocessing.get_context("spawn")
    results: list[dict[str, Any] | None] = [None] * len(rows)
    todo = list(range(len(rows)))[::-1]
    pool = [_Worker(ctx, memory_gib) for _ in range(min(workers, len(rows)))]
    bar = tqdm(total=len(rows), desc="realism", unit="task", disable=not progress)
    try:
        while todo or any(w.job for w in pool):
            for w in pool:
                if w.ready and w.job is None and todo:
                    i = todo.pop()
                    w.job, w.started = (i, rows[i]), time.monotonic()
                    w.conn.send(rows[i])
            waits = [w.started + timeout_s - time.monotonic() for w in pool if w.job]
            ready = wait_ready([w.conn for w in pool] + [w.proc.sentinel for w in pool],
                               timeout=max(0.05, min(waits)) if waits else 1.0)
            for k, w in enumerate(pool):
                done = None
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg == "ready":
                        w.ready = True
                        continue
                    if msg is not None and w.job:
                        done = msg if "internal" in msg else _failure(w.job[1], msg["status"], msg["error"])
                if done is None and w.job and not w.proc.is_alive():
                    done = _failure(w.job[1], "crash", f"worker exit code {w.proc.exitcode}")
                elif done is None and w.job and time.monotonic() - w.started > timeout_s:
                    done = _failure(w.job[1], "timeout", f"no result in {timeout_s:g} s")
                elif done is None and not w.proc.is_alive():  # died idle (start-up failure)
                    raise RuntimeError(f"realism worker exited with code {w.proc.exitcode} before any row")
                if done is None:
                    continue
                results[w.job[0]] = done
                bar.update(1)
                if done["status"] in ("timeout", "crash", "oom"):
                    w.kill()
                    pool[k] = _Worker(ctx, memory_gib) if todo else None
                else:
                    w.job = None
            pool = [w for w in pool if w is not None]
    finally:
        bar.close()
        for w in pool:
            if w is not None and w.proc.is_alive():
                try:
                    w.conn.send(None)
                except OSError:
                    pass
                w.proc.join(2)
                if w.proc.is_alive():
                    w.kill()
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------------
# input, cache, output


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a dataset (``task.task_file.read_published``: a folder's ``data/*.parquet`` shards, a
    ``.parquet`` or a ``.jsonl`` / ``.json`` file), as dicts with ``code``, ``name`` (``<file or folder
    name>:<position>``) and, when present, ``task_id``, ``ops``, ``data_source`` and ``dtype``.

    Raises:
        task.task_file.InputError (a ValueError): see ``read_published``.
    """
    from opforge.task.task_file import read_published

    path = Path(path)
    df = read_published(path)
    keep = [c for c in ("task_id", "code", "ops", "data_source", "dtype") if c in df.columns]
    rows = df[keep].to_dict("records")
    for i, row in enumerate(rows):
        row["name"] = f"{path.name}:{i}"
    return rows


def _versions() -> dict[str, str | None]:
    import torch

    try:
        import transformers

        tf = transformers.__version__
    except ImportError:
        tf = None
    return {"torch": torch.__version__, "transformers": tf}


def row_key(row: dict[str, Any], versions: dict[str, Any]) -> str:
    """Cache key of a row: SHA-256 of its code, labels, data source, MEASURE_VERSION and versions."""
    blob = json.dumps([MEASURE_VERSION, versions, row.get("code"), str(row.get("ops")),
                       row.get("data_source"), row.get("dtype")], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def measure_with_cache(rows: list[dict[str, Any]], cache: Path | None,
                       **kw) -> tuple[list[dict[str, Any]], int]:
    """``measure_rows`` that reads and appends records in the JSONL ``cache`` (timeouts and crashes, which
    depend on the machine's load, are not cached). Returns the records in row order and how many came
    from the cache."""
    versions = _versions()
    keys = [row_key(r, versions) for r in rows]
    known: dict[str, dict] = {}
    if cache and cache.exists():
        for line in cache.read_text().splitlines():
            try:
                item = json.loads(line)
                known[item["key"]] = item["record"]
            except (json.JSONDecodeError, KeyError):
                continue
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing:
        if kw.get("progress", True):
            print(f"measuring {len(missing)} rows ({len(rows) - len(missing)} from the cache)", file=sys.stderr)
        fresh = measure_rows([rows[i] for i in missing], **kw)
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            with cache.open("a") as f:
                for i, rec in zip(missing, fresh, strict=True):
                    if rec["status"] not in ("timeout", "crash", "oom"):
                        f.write(json.dumps({"key": keys[i], "record": rec}) + "\n")
        for i, rec in zip(missing, fresh, strict=True):
            known[keys[i]] = rec
    records = [{**known[k], "name": measure_static(r)["name"]} for k, r in zip(keys, rows, strict=True)]
    return records, len(rows) - len(missing)


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if "_share" in key:
        return f"{100 * v:.1f} %"
    if key.startswith("input_bytes"):
        return f"{v / 1e6:,.1f} MB"
    if isinstance(v, float):
        return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"
    return str(v)


_TABLE = ["rows", "n_built", "n_traced", "batch_p50", "batch_p90", "batch_share_gt_8192", "largest_non_batch_p50",
          "heavy_op_share", "gemm_share", "conv_share", "attention_share", "rnn_share", "top_exotic_op",
          "top_exotic_op_share", "top_op_set", "top_op_set_share", "distinct_op_sets", "distinct_op_set_share",
          "internal_name_share", "low_precision_share", "non_multiple_of_8_share",
          "distinct_non_batch_dims", "distinct_non_batch_dims_500", "input_bytes_p50", "input_bytes_p95",
          "n_transformers", "transformers_models_import_share", "transformers_any_import_share"]


def format_table(results: list[dict[str, Any]]) -> str:
    """Figures of one or more results side by side, with the issue's target and ``ok`` / ``FAIL`` per result,
    then each result's 20 most common ops.

    Args:
        results: dicts with ``figures`` (``summarise``), ``targets`` (``check_targets``) and optionally
            ``input.path`` (the column title is its last component).
    """
    targets = {k: t for k, t, _ in TARGETS}
    names = [Path(r.get("input", {}).get("path", "?")).name for r in results]
    head = ["figure", *names, "target"]
    lines = [head]
    for key in _TABLE:
        cells = [key]
        for r in results:
            v = r["figures"].get(key)
            mark = ""
            if key in targets and v is not None:
                mark = " ok" if r["targets"][key]["pass"] else " FAIL"
            cells.append(_fmt(key, v) + mark)
        cells.append(targets.get(key, ""))
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    for r, name in zip(results, names, strict=True):
        top = ", ".join(f"{op} {100 * s:.1f} %" for op, s in r["figures"]["top20_ops"])
        out.append(f"\n{name} top 20 ops (share of traced tasks): {top}")
    return "\n".join(out)


def by_source(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``summarise`` of the ``torch`` rows (``data_source`` ``torch#k``) and of the ``transformers`` rows
    (a part without rows is left out)."""
    return {name: summarise(part) for name, part in _by_source(records).items()}
