"""Op relevance: how often each operation occurs in the forward pass of real models.

Every installed transformers model family is built from its default config with its depth cut to 1-2 layers
(enough to hold each distinct layer type: ``_shrink``) on the ``meta`` device (no weights, no memory), its
base model (``MODEL_MAPPING``) is run once on inputs of the right kind (``input_ids``, ``pixel_values``,
``input_features``, ``input_values``; ``decoder_input_ids`` for encoder-decoders), and the ops its code calls
are counted with the task tracer (``task/trace.py: trace_ops``). With torchvision installed, its
classification models are traced the same way on a 224 x 224 image. Each model contributes once: an op's
``share`` is the fraction of traced models that call it at least once, ``call_share`` the mean over models of
its share of that model's op calls.

Ops are keyed by canonical name (``task/op_names.py``) merged with ``public_api.CANONICAL_ALIASES``; an
``nn`` module call counts under the function that module stands for (``nn.BatchNorm2d`` -> ``batch_norm``,
``public_api.label_canonical``). The transformers module classes a model runs (``LlamaRMSNorm``) are counted
in ``blocks``. The snapshot shipped with the package is ``seeds/data/op_relevance.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import re
import signal
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.seeds.public_api import alias_groups, label_canonical, merged_canonical

RELEVANCE_VERSION = 1
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_PATH = DATA_DIR / "op_relevance.json"
# Depth fields cut to KEEP_LAYERS (or to the prefix of ``layer_types`` holding every distinct type, at most
# MAX_LAYERS). Vision stage depths are kept (their blocks are small).
DEPTH_FIELDS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                "num_encoder_layers", "num_decoder_layers", "num_blocks")
KEEP_LAYERS = 2
# Mixture-of-experts layers run as batched matmuls: the grouped_mm kernel transformers picks by default needs
# bfloat16 on CPU / meta, the per-expert loop needs routing values that meta tensors do not have.
EXPERTS_IMPLEMENTATION = "batched_mm"
MAX_LAYERS = 8
SEQ_LEN = 32  # tokens of the input_ids given to text models
AUDIO_SAMPLES = 16000  # 1 s of 16 kHz audio for input_values models
MODEL_TIMEOUT_S = 120  # per model (build + trace); a model past it is recorded as skipped
# Calls that switch modes, build constant tensors or cast dtypes: traced, but not operations of the model.
NOT_OPS = frozenset({"set_grad_enabled", "is_grad_enabled", "is_autocast_enabled", "get_autocast_dtype",
                     "is_inference_mode_enabled", "tensor", "as_tensor", "bool", "long", "int", "short", "byte",
                     "char", "is_floating_point", "is_complex", "finfo", "iinfo", "get_default_dtype",
                     "is_tensor", "numel"})
SETTINGS = {"keep_layers": KEEP_LAYERS, "max_layers": MAX_LAYERS, "seq_len": SEQ_LEN, "version": RELEVANCE_VERSION,
            "experts": EXPERTS_IMPLEMENTATION, "not_ops": sorted(NOT_OPS),
            "inputs": "main,all,features-transposed;sizes-from-sub-configs", "meta_reads": "bool,item,int,index,float,tolist"}


@dataclass
class OpRelevance:
    """One canonical op: ``models`` traced models call it, ``calls`` times in all; ``share`` = models / n_models
    (in [0, 1]); ``call_share`` = mean over all traced models of the op's fraction of that model's calls."""

    canonical: str
    models: int
    calls: int
    share: float
    call_share: float = 0.0


class RelevanceError(ValueError):
    """A relevance table or op-weights file is malformed; the message names the file and field / key."""


@dataclass
class RelevanceTable:
    """Op relevance over ``n_models`` traced models.

    Attributes:
        version: ``RELEVANCE_VERSION``. libraries: versions traced (``torchvision`` None = not installed).
        n_models: models traced successfully. ops: canonical name -> ``OpRelevance``.
        blocks: transformers module class name -> number of traced models that run it.
        models: the traced model names (``transformers:llama``, ``torchvision:resnet50``).
        skipped: model name -> why it could not be traced (``ExcType: message``, first 200 characters).
    """

    version: int = RELEVANCE_VERSION
    libraries: dict = field(default_factory=dict)
    n_models: int = 0
    ops: dict[str, OpRelevance] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def top(self, k: int = 40) -> list[OpRelevance]:
        """The ``k`` ops with the largest ``share`` (ties: larger ``call_share``, then name)."""
        return sorted(self.ops.values(), key=lambda o: (-o.share, -o.call_share, o.canonical))[:k]

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version, "libraries": self.libraries, "n_models": self.n_models,
            "ops": {k: {"models": o.models, "calls": o.calls, "share": round(o.share, 6),
                        "call_share": round(o.call_share, 6)} for k, o in sorted(self.ops.items())},
            "blocks": dict(sorted(self.blocks.items())), "models": self.models,
            "skipped": dict(sorted(self.skipped.items())),
        }, indent=1)

    @classmethod
    def from_json(cls, s: str) -> RelevanceTable:
        """Parse ``to_json`` output. Raises ``RelevanceError`` naming the field that is missing or wrong."""
        try:
            data = json.loads(s)
        except json.JSONDecodeError as exc:
            raise RelevanceError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RelevanceError("top level: expected an object")
        if data.get("version") != RELEVANCE_VERSION:
            raise RelevanceError(f"field 'version': expected {RELEVANCE_VERSION}, got {data.get('version')!r} "
                                 f"(regenerate with `opforge seeds relevance`)")
        n = data.get("n_models")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RelevanceError(f"field 'n_models': expected an int >= 0, got {n!r}")
        raw = data.get("ops")
        if not isinstance(raw, dict):
            raise RelevanceError("field 'ops': expected an object")
        ops = {}
        for name, o in raw.items():
            if not isinstance(o, dict):
                raise RelevanceError(f"field 'ops.{name}': expected an object")
            for key in ("models", "calls"):
                if not isinstance(o.get(key), int) or o[key] < 0:
                    raise RelevanceError(f"field 'ops.{name}.{key}': expected an int >= 0, got {o.get(key)!r}")
            for key in ("share", "call_share"):
                v = o.get(key, 0.0)
                if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                    raise RelevanceError(f"field 'ops.{name}.{key}': expected a number in [0, 1], got {v!r}")
            ops[name] = OpRelevance(name, o["models"], o["calls"], float(o["share"]), float(o.get("call_share", 0.0)))
        blocks = data.get("blocks", {})
        if not isinstance(blocks, dict) or not all(isinstance(v, int) for v in blocks.values()):
            raise RelevanceError("field 'blocks': expected an object of ints")
        libraries = data.get("libraries", {})
        if not isinstance(libraries, dict):
            raise RelevanceError("field 'libraries': expected an object")
        return cls(version=RELEVANCE_VERSION, libraries=libraries, n_models=n, ops=ops, blocks=blocks,
                   models=list(data.get("models", [])), skipped=dict(data.get("skipped", {})))


def load_relevance(path) -> RelevanceTable:
    """Read a relevance table JSON file. Raises FileNotFoundError, or ``RelevanceError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"op relevance table not found: {path} (write one with "
                                f"`opforge seeds relevance --out {path}`)")
    try:
        return RelevanceTable.from_json(path.read_text())
    except RelevanceError as exc:
        raise RelevanceError(f"{path}: {exc}") from None


def default_relevance() -> RelevanceTable:
    """The packaged snapshot ``seeds/data/op_relevance.json``."""
    return load_relevance(DEFAULT_PATH)


def label_relevance(labels: list[str], table: RelevanceTable) -> dict[str, float]:
    """Seed-op label -> relevance share in [0, 1].

    A label's op is ``public_api.label_canonical`` (``+`` -> add, ``nn.ReLU`` -> relu, ``torch.fmin`` ->
    minimum); labels of one op (``public_api.alias_groups``) split its ``share`` evenly, so ``torch.relu``,
    ``F.relu`` and ``nn.ReLU`` together weigh what relu weighs. A transformers class label takes the share of
    traced models that run that class (``blocks``). Labels of ops no traced model calls get 0.0.
    """
    groups = alias_groups(list(labels))
    size = Counter(groups.values())
    out = {}
    n = max(table.n_models, 1)
    for label in labels:
        canon = label_canonical(label)
        if canon in table.ops:
            share = table.ops[canon].share
        elif label in table.blocks:
            share = min(table.blocks[label] / n, 1.0)
        else:
            share = 0.0
        out[label] = share / size[groups[label]]
    return out


def load_op_weights(path) -> dict[str, float]:
    """Read an ``--op-weights`` file: a YAML or JSON mapping of seed-op label -> weight (a number >= 0).

    Raises FileNotFoundError naming the file, or ``RelevanceError`` naming the file and the bad key.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"op weights file not found: {path}")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise RelevanceError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise RelevanceError(f"{path}: expected a mapping of op label -> weight, got {type(data).__name__}")
    out = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise RelevanceError(f"{path}: key {key!r}: expected an op label string")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
            raise RelevanceError(f"{path}: key {key!r}: weight must be a number >= 0, got {value!r}")
        out[key] = float(value)
    return out


# --------------------------------------------------------------------------------------------- tracing


def op_key(op) -> str:
    """Table key of one ``TracedOp``: an ``nn`` module by its label's function, a function by its canonical name."""
    if op.kind == "module" and op.labels and op.labels[0].startswith("nn."):
        return label_canonical(op.labels[0])
    return merged_canonical(sorted(op.canonical)[0]) if op.canonical else label_canonical(op.labels[0])


def count_ops(ops) -> Counter:
    """Calls per table key of a list of ``TracedOp``."""
    return Counter(k for k in (op_key(op) for op in ops) if k not in NOT_OPS)


def _shrink(cfg, level: int = 0) -> None:
    """Cut a config's depth fields (and its sub-configs') in place; see ``DEPTH_FIELDS``."""
    from transformers import PretrainedConfig

    keep = KEEP_LAYERS
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        distinct = set(types)
        for i in range(len(types)):
            if set(types[: i + 1]) == distinct:
                keep = max(keep, i + 1)
                break
    fk = getattr(cfg, "first_k_dense_replace", None)
    if isinstance(fk, int) and not isinstance(fk, bool):
        keep = max(keep, fk + 1)
    keep = min(keep, MAX_LAYERS)
    aliases = getattr(cfg, "attribute_map", {}) or {}
    for name in DEPTH_FIELDS:
        if "stage" in str(aliases.get(name, "")):
            continue  # backbones alias num_hidden_layers to their stage count: the ladder is kept
        v = getattr(cfg, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > keep:
            with contextlib.suppress(Exception):
                setattr(cfg, name, keep)
    for name in ("layer_types", "mlp_layer_types"):
        v = getattr(cfg, name, None)
        if isinstance(v, (list, tuple)) and len(v) > keep:
            with contextlib.suppress(Exception):
                setattr(cfg, name, type(v)(v[:keep]))
    with contextlib.suppress(Exception):
        cfg._experts_implementation = EXPERTS_IMPLEMENTATION
    if level < 3:
        for v in list(vars(cfg).values()):
            if isinstance(v, PretrainedConfig):
                _shrink(v, level + 1)


def _find(cfg, name: str):
    """The first positive int ``name`` of a config or its sub-configs, breadth first (None when absent)."""
    from transformers import PretrainedConfig

    queue = [cfg]
    while queue:
        c = queue.pop(0)
        v = getattr(c, name, None)
        if isinstance(v, (list, tuple)) and v:
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
        queue.extend(x for x in vars(c).values() if isinstance(x, PretrainedConfig))
    return None


def _input_sets(model, cfg) -> list[dict[str, Any]]:
    """Candidate keyword inputs (meta tensors), tried in order: the main input alone, then every known input
    the forward accepts, then both again with ``input_features`` as (batch, frames, mel)."""
    import torch

    params = set(inspect.signature(model.forward).parameters)
    ch, side = _find(cfg, "num_channels") or 3, _find(cfg, "image_size") or 224
    mel = _find(cfg, "num_mel_bins") or 80
    src = _find(cfg, "max_source_positions")
    frames = 2 * src if src else 3000  # Whisper-style encoders: 2 x positions (3000 frames = 30 s)
    known = {
        "input_ids": lambda: torch.zeros(1, SEQ_LEN, dtype=torch.long),
        "pixel_values": lambda: torch.empty(1, ch, side, side),
        "input_features": lambda: torch.empty(1, int(mel), frames),
        "input_values": lambda: torch.empty(1, AUDIO_SAMPLES),
        "decoder_input_ids": lambda: torch.zeros(1, 8, dtype=torch.long),
    }
    main = getattr(model, "main_input_name", "input_ids")
    sets = []
    first = [main] if main in known and main in params else []
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params and main != "decoder_input_ids":
        first.append("decoder_input_ids")
    if first:
        sets.append(first)
    every = [k for k in known if k in params]
    if every and every != first:
        sets.append(every)
    out = []
    with torch.device("meta"):
        for names in sets:
            out.append({n: known[n]() for n in names})
        for kwargs in list(out):  # conformer-style encoders take (batch, frames, mel)
            if "input_features" in kwargs:
                out.append({**kwargs, "input_features": kwargs["input_features"].transpose(1, 2).contiguous()})
    return out


def _wrapper(model, kwargs):
    """Wrap ``model`` so ``trace_ops`` can call it with keyword inputs (an ``nn.Module`` defined outside
    ``torch.nn``, so the tracer treats it as user code)."""
    import torch

    class KwargsCall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self):
            return self.inner(**kwargs)

    return KwargsCall()


@contextlib.contextmanager
def _time_limit(seconds: int):
    """Raise TimeoutError in the main thread after ``seconds`` (no limit off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise TimeoutError(f"model took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# Data-dependent reads of a meta tensor (``if mask.all():``, ``int(lengths.max())``) have no value; they read
# as the no-padding case instead of failing the whole model: True, 1, a list of ones.
_META_READS = {"__bool__": lambda t: True, "item": lambda t: True if str(t.dtype) == "torch.bool" else 1,
               "__int__": lambda t: 1, "__index__": lambda t: 1, "__float__": lambda t: 1.0,
               "tolist": lambda t: _ones_list(tuple(t.shape))}


def _ones_list(shape: tuple[int, ...]):
    return 1 if not shape else [_ones_list(shape[1:]) for _ in range(shape[0])]


def _meta_reads_mode():
    """A ``TorchFunctionMode`` answering ``_META_READS`` on meta tensors (other calls pass through)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class MetaReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in _META_READS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                return _META_READS[name](args[0])
            return func(*args, **(kwargs or {}))

    return MetaReads()


def trace_model(model, inputs: list | dict) -> tuple[Counter, set[str]]:
    """Trace one forward of ``model`` (on ``meta``); returns (calls per op key, transformers block class names).

    ``inputs``: positional list or keyword dict of meta tensors. Data-dependent reads of meta tensors answer
    as ``_META_READS`` says. Raises what the forward raises.
    """
    import torch

    blocks: set[str] = set()

    def pre(mod, args):
        mod_name = type(mod).__module__
        if mod_name.startswith("transformers."):
            blocks.add(type(mod).__name__)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        with _meta_reads_mode():  # entered first, so the tracer's mode sees each call before it
            ops = _trace(model, inputs)
    finally:
        handle.remove()
    return count_ops(ops), blocks


def _trace(model, inputs):
    from opforge.task.trace import trace_ops

    if isinstance(inputs, dict):
        return trace_ops(_wrapper(model, inputs), [])
    return trace_ops(model, list(inputs))


def _trace_family(model_type: str) -> tuple[Counter, set[str]]:
    """Build ``model_type``'s base model from its shrunk default config on meta and trace it."""
    import torch
    from transformers import CONFIG_MAPPING, MODEL_MAPPING

    cfg = CONFIG_MAPPING[model_type]()
    _shrink(cfg)
    model_cls = MODEL_MAPPING[type(cfg)]
    with torch.device("meta"):
        model = model_cls(cfg)
    model.eval()
    errors = []
    for kwargs in _input_sets(model, cfg):
        try:
            return trace_model(model, kwargs)
        except Exception as exc:  # noqa: BLE001 - try the next input set, report the last error
            errors.append(exc)
    if errors:
        raise errors[-1]
    raise ValueError("no known input (input_ids, pixel_values, input_features, input_values) in forward")


def _cache_key(libraries: dict) -> str:
    return hashlib.sha256(json.dumps([libraries, SETTINGS], sort_keys=True).encode()).hexdigest()[:16]


def _quiet():
    import transformers

    @contextlib.contextmanager
    def cm():
        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            transformers.logging.set_verbosity(level)

    return cm()


def harvest_relevance(progress: bool = True, families: list[str] | None = None,
                      cnn_models: list[tuple[str, Any]] | None = None, cache: Path | None = None,
                      timeout_s: int = MODEL_TIMEOUT_S) -> RelevanceTable:
    """Trace transformers families (all of ``CONFIG_MAPPING``, or ``families``) and CNNs; aggregate per model.

    ``cnn_models``: (name, builder) pairs taking ``N x 3 x 224 x 224`` images, traced instead of torchvision's
    classification models (which are traced when torchvision is installed and ``cnn_models`` is None).
    ``cache``: a JSONL file of per-model results keyed by library versions and ``SETTINGS``; models already in
    it are not traced again (resume after a kill). A model whose build or forward fails, or takes more than
    ``timeout_s``, is listed in ``skipped``. About 10-20 minutes for every family on 2 CPU cores.
    """
    import torch
    import transformers
    from opforge.seeds.vocabulary import DEFAULT_IMAGE, TORCHVISION_INPUT, torchvision_models
    from tqdm import tqdm
    from transformers import CONFIG_MAPPING, MODEL_MAPPING

    tv_version = None
    if cnn_models is None:
        cnn_models = torchvision_models()
        if cnn_models:
            import torchvision

            tv_version = torchvision.__version__.split("+")[0]
        cnn_source = "torchvision"
    else:
        cnn_source = "cnn"
    libraries = {"transformers": transformers.__version__, "torchvision": tv_version,
                 "torch": torch.__version__.split("+")[0]}
    key = _cache_key(libraries)
    done: dict[str, dict] = {}
    if cache is not None and Path(cache).is_file():
        for line in Path(cache).read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                row = json.loads(line)
                if row.get("key") == key:
                    done[row["model"]] = row
    todo: list[tuple[str, Any]] = []
    if families is None:
        families = list(CONFIG_MAPPING.keys())
    for fam in families:
        todo.append((f"transformers:{fam}", fam))
    for name, build in cnn_models:
        todo.append((f"{cnn_source}:{name}", (name, build)))

    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
    sink = open(cache, "a") if cache is not None else None  # noqa: SIM115 - closed in finally
    results: dict[str, dict] = {}
    try:
        for model_name, what in tqdm(todo, desc="relevance: trace", disable=not progress, unit="model"):
            if model_name in done:
                results[model_name] = done[model_name]
                continue
            row: dict[str, Any] = {"model": model_name, "key": key}
            try:
                with _quiet(), _time_limit(timeout_s):
                    if isinstance(what, str):
                        if what not in CONFIG_MAPPING:
                            raise KeyError(f"unknown model type {what!r}")
                        if CONFIG_MAPPING[what] not in MODEL_MAPPING:
                            raise KeyError("no base model class (MODEL_MAPPING)")
                        calls, blocks = _trace_family(what)
                    else:
                        name, build = what
                        with torch.device("meta"):
                            model = build()
                        model.eval()
                        side = TORCHVISION_INPUT.get(name, DEFAULT_IMAGE)
                        calls, blocks = trace_model(model, [torch.empty(1, 3, side, side, device="meta")])
                row["ops"], row["blocks"] = dict(calls), sorted(blocks)
                if not calls:
                    row = {"model": model_name, "key": key, "error": "no ops traced"}
            except Exception as exc:  # noqa: BLE001 - one model's failure is a record, never a dead run
                # the message may name files of this machine: keep paths from site-packages on only
                message = re.sub(r"\S*/site-packages/", "site-packages/", str(exc))
                row["error"] = f"{type(exc).__name__}: {message}"[:200]
            results[model_name] = row
            if sink is not None:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
    return aggregate(results, libraries)


def aggregate(results: dict[str, dict], libraries: dict) -> RelevanceTable:
    """Per-model rows (``ops``: op -> calls, ``blocks``, or ``error``) -> ``RelevanceTable``; each model once."""
    ok = {m: r for m, r in results.items() if "error" not in r}
    n = len(ok)
    models_per: Counter = Counter()
    calls: Counter = Counter()
    call_share: Counter = Counter()
    blocks: Counter = Counter()
    for r in ok.values():
        total = sum(r["ops"].values())
        for op, c in r["ops"].items():
            models_per[op] += 1
            calls[op] += c
            call_share[op] += c / total
        blocks.update(set(r.get("blocks", [])))
    ops = {op: OpRelevance(op, models_per[op], calls[op], models_per[op] / n, call_share[op] / n) for op in models_per}
    return RelevanceTable(version=RELEVANCE_VERSION, libraries=libraries, n_models=n, ops=ops, blocks=dict(blocks),
                          models=sorted(ok), skipped={m: r["error"] for m, r in results.items() if "error" in r})


def write_relevance(table: RelevanceTable, path) -> Path:
    """Write ``table`` as JSON at ``path`` (parent folders created), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(table.to_json())
    tmp.replace(path)
    return path
