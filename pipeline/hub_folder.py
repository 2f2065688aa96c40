"""The Hugging Face dataset folder of a run (``RUN_DIR/hf``): Parquet shards, the data card, plots.

Layout::

    hf/README.md                          card with YAML front matter (configs, dataset_info, licence...)
    hf/data/train-00000-of-0000N.parquet  the rows, columns and types of ``COLUMNS``
    hf/plots/*.png                        figures the card links
    hf/opforge_run.json                   resolved run config, funnel and environment (provenance)

``validate_folder`` loads the folder with ``datasets`` exactly as a user would and checks it; publication
uploads only a folder that passed it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# Published columns (docs/DESIGN.md §2): name, Arrow type, datasets dtype, meaning. The first three are
# CUDA-Agent-Ops-6K's columns with the same meaning.
COLUMNS: list[tuple[str, pa.DataType, str, str]] = [
    ("ops", pa.string(), "string", "JSON list of op labels the code calls (`nn.Conv2d`, `F.gelu`, `torch.cumsum`; a "
                                   "transformers module's class name)"),
    ("data_source", pa.string(), "string", "`torch#k` (k composed ops) or `transformers`"),
    ("code", pa.string(), "string", "the task: KernelBench-format Python source (`Model`, `get_inputs`, "
                                    "`get_init_inputs`)"),
    ("task_id", pa.string(), "string", "first 16 hex digits of the SHA-256 of the normalised source"),
    ("num_ops", pa.int64(), "int64", "number of composed ops"),
    ("graph", pa.string(), "string", "the op graph as JSON (networkx node-link) or the transformers module"),
    ("categories", pa.string(), "string", "JSON list of the seed ops' categories"),
    ("input_shapes", pa.string(), "string", "JSON list of the input tensor shapes"),
    ("dtype", pa.string(), "string", "floating dtype of the inputs and parameters: `float32`, `bfloat16` or "
                                     "`float16` (outputs are judged at that dtype's tolerance)"),
    ("size_context", pa.string(), "string", "the model family whose config the sizes come from (`llama`, "
                                            "`resnet`...; empty for fixed-size profiles)"),
    ("provenance", pa.string(), "string", "JSON: where the task comes from: a motif's `source` model "
                                          "(`transformers:llama`, `torchvision:resnet50`), module `scopes` and "
                                          "`modules`, `category`, `mutation`; a transformers block's `block`; "
                                          "empty for the random composer"),
    ("eager_ms", pa.float64(), "float64", "median eager runtime in ms per call on `gpu`: bursts of back-to-back "
                                          "calls on rotating input sets, L2 flushed before each, device "
                                          "synchronised after (engine.timing; CPU: wall clock)"),
    ("compile_ms", pa.float64(), "float64", "median `torch.compile` (Inductor) runtime in ms on `gpu` "
                                            "(null on CPU)"),
    ("roofline_ms", pa.float64(), "float64", "ms of one ideal fused kernel on `gpu`'s datasheet peaks (the H200 "
                                             "SXM's for a CPU run; see Headroom): max(FLOPs / peak, bytes of inputs, "
                                             "parameters read and outputs / bandwidth), traced on `meta`"),
    ("fusion_gain", pa.float64(), "float64", "sum of each op's own roofline time / `roofline_ms`: the most fusing "
                                             "the ops can win (1.0: nothing)"),
    ("gpu", pa.string(), "string", "device the measurements were taken on (`cpu` when no GPU)"),
    ("torch_version", pa.string(), "string", "torch version of the run"),
    ("kernelbench_nearest", pa.string(), "string", "nearest KernelBench problem, `L<level>/<name>`"),
    ("kernelbench_similarity", pa.float64(), "float64", "structural similarity (0-1) to that problem"),
    ("generator", pa.string(), "string", "generator name and version"),
    ("generator_seed", pa.int64(), "int64", "the run seed"),
    ("opforge_version", pa.string(), "string", "opforge version that built the row"),
    ("shape_variants", pa.string(), "string", "JSON list of hidden extra input shapes the grader also checks "
                                              "(`{\"sizes\": {constant: value}, \"input_shapes\", \"work_ratio\"}`; "
                                              "see Hidden shape variants)"),
]
SCHEMA = pa.schema([(name, typ) for name, typ, _, _ in COLUMNS])
ROWS_PER_SHARD = 2000


class FolderError(ValueError):
    """The Hub folder is missing or fails validation; the message names the folder and the problem."""


def features() -> list[dict[str, str]]:
    """``dataset_info.features`` for the card."""
    return [{"name": name, "dtype": dtype} for name, _, dtype, _ in COLUMNS]


def write_shards(rows: pd.DataFrame, data_dir: Path) -> tuple[list[Path], int]:
    """Write ``rows`` (the ``COLUMNS``) as ``train-XXXXX-of-YYYYY.parquet`` shards; returns (paths, bytes)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(rows[[c for c, *_ in COLUMNS]], schema=SCHEMA, preserve_index=False)
    n_shards = max(1, math.ceil(len(rows) / ROWS_PER_SHARD))
    paths = []
    for k in range(n_shards):
        path = data_dir / f"train-{k:05d}-of-{n_shards:05d}.parquet"
        pq.write_table(table.slice(k * ROWS_PER_SHARD, ROWS_PER_SHARD), path)
        paths.append(path)
    return paths, int(table.nbytes)


def build_hub_folder(rows: pd.DataFrame, folder: str | Path, card_context: dict[str, Any],
                     provenance: dict[str, Any]) -> Path:
    """Write the Hub folder for ``rows`` (already in ``COLUMNS`` form) into ``folder``, replacing it.

    ``card_context`` supplies the card's measured sections (see data_cards/card.md.j2); the front matter,
    columns table and plots are added here. Written to ``folder.tmp`` first and renamed, so an interrupted
    build never leaves a half folder under the final name.
    """
    from opforge.data_cards.plots import write_plots
    from opforge.data_cards.render import front_matter, render_card

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _, nbytes = write_shards(rows, tmp / "data")
    write_plots(rows, tmp / "plots", card_context["env"]["device_label"])
    fm = front_matter(pretty_name=card_context["pretty_name"], license=card_context["license_id"],
                      features=features(), n_rows=len(rows), num_bytes=nbytes, data_glob="data/train-*.parquet",
                      tags=["kernelbench", "cuda", "pytorch", "code", "opforge", "torch-compile"])
    columns = [{"name": n, "dtype": d, "doc": column_doc(n, doc, rows)} for n, _, d, doc in COLUMNS]
    text = render_card({**card_context, "front_matter": fm, "columns": columns, "n_rows": len(rows)})
    (tmp / "README.md").write_text(text, encoding="utf-8")
    (tmp / "opforge_run.json").write_text(json.dumps(provenance, indent=2, sort_keys=True, default=str))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def column_doc(name: str, doc: str, rows: pd.DataFrame) -> str:
    """A column's meaning as the card states it, with what the rows hold where that varies: the range of k of the
    ``torch#k`` values of ``data_source`` and whether any row is a ``transformers`` block."""
    if name != "data_source" or "data_source" not in rows:
        return doc
    import re

    sources = set(rows["data_source"].astype(str))
    ks = sorted(int(m.group(1)) for x in sources if (m := re.fullmatch(r"torch#(\d+)", x)))
    parts = []
    if ks:
        span = f"{ks[0]}" if ks[0] == ks[-1] else f"{ks[0]}-{ks[-1]}"
        parts.append(f"`torch#k` (k composed ops; k = {span} in these rows)")
    if "transformers" in sources:
        parts.append("`transformers` (a transformers block)")
    return " or ".join(parts) or doc


def manifest(folder: str | Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``folder`` (what an upload would send)."""
    folder = Path(folder)
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def validate_folder(folder: str | Path) -> dict[str, Any]:
    """Load ``folder`` with ``datasets.load_dataset(folder, split="train")`` offline and check it: the
    declared features, the declared row count, ``json.loads(ops)`` on every row, a unique ``task_id`` per row.

    Returns ``{"rows": n, "manifest": manifest(folder)}`` (the manifest taken before loading).

    Raises:
        FolderError: missing folder / card / data, or any check failing.
    """
    import yaml

    folder = Path(folder)
    if not (folder / "README.md").is_file() or not list((folder / "data").glob("*.parquet")):
        raise FolderError(f"{folder}: not a dataset folder (needs README.md and data/*.parquet)")
    files = manifest(folder)
    text = (folder / "README.md").read_text(encoding="utf-8")
    try:
        meta = yaml.safe_load(text.split("---", 2)[1])
    except (IndexError, yaml.YAMLError) as exc:
        raise FolderError(f"{folder}/README.md: no readable YAML front matter ({exc})") from None
    declared = meta["dataset_info"]["splits"][0]["num_examples"]
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        from datasets import load_dataset

        ds = load_dataset(str(folder), split="train")
    except Exception as exc:  # noqa: BLE001 - any loading failure is this folder's
        raise FolderError(f"{folder}: load_dataset failed ({type(exc).__name__}: {exc})") from None
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    want = {f["name"]: f["dtype"] for f in meta["dataset_info"]["features"]}
    got = {name: getattr(feat, "dtype", str(feat)) for name, feat in ds.features.items()}
    if got != want:
        raise FolderError(f"{folder}: features {got} differ from the card's {want}")
    if len(ds) != declared:
        raise FolderError(f"{folder}: {len(ds)} rows, the card declares {declared}")
    for i, ops in enumerate(ds["ops"]):
        try:
            if not isinstance(json.loads(ops), list):
                raise ValueError("not a list")
        except (TypeError, ValueError) as exc:
            raise FolderError(f"{folder}: row {i}: ops is not a JSON list ({exc})") from None
    if len(set(ds["task_id"])) != len(ds):
        raise FolderError(f"{folder}: task_id is not unique")
    if manifest(folder) != files:
        raise FolderError(f"{folder}: files changed while it was being validated")
    return {"rows": len(ds), "manifest": files}
