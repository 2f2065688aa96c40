"""Benchmark results that describe themselves.

Every benchmark script writes its result with ``write(name, payload)``: the file
``benchmarks/results/<machine>/<name>.json`` holds ``{"provenance": describe(), **payload}``, so a result
always names the commit (and whether the tree had uncommitted changes), the date, the command line, the
machine, the GPU and driver, and the library and opforge logic versions it was measured with. One file per
measurement and machine: a new run of the same measurement replaces it (git keeps the history).

``machine`` is a short name: the GPU model (``h200``, ``h100``, ``a100``...) when ``nvidia-smi`` lists one,
else ``cpu-<N>core`` with N the usable cores. Pass it explicitly when the script measured something else
than the machine it writes from.

Usage from a script under ``benchmarks/`` (run as ``python benchmarks/NAME.py``, so this folder is on
``sys.path``)::

    import record
    path = record.write("compose", {"n": 10000, "seconds": 59.8})
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Distributions whose version a result records (None when not installed).
VERSIONED = ("torch", "triton", "transformers", "dask", "distributed", "datasets", "numpy")


def git(*args: str) -> str | None:
    """``git -C <repository> ARGS``'s stripped output, None outside git or when it fails."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def gpus() -> list[dict[str, str]]:
    """``nvidia-smi``'s GPUs: name, memory (MiB) and driver each (``opforge.engine.ledger.gpus``); empty
    without one. CUDA is not initialised."""
    from opforge.engine.ledger import gpus as listed

    return [{k: g[k] for k in ("name", "memory_mib", "driver")} for g in listed()]


def _command() -> str:
    """This process's command line, the interpreter as ``python`` and paths inside the repository relative
    to it (so a result names no folder of the machine it ran on)."""
    args = ["python", *sys.argv]
    root = str(ROOT) + os.sep
    return shlex.join(a.replace(root, "") for a in args)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_name(gpu_list: list[dict[str, str]] | None = None) -> str:
    """``h200`` / ``h100`` / ... from the first GPU's model name, else ``cpu-<cores>core``."""
    gpu_list = gpus() if gpu_list is None else gpu_list
    if gpu_list:
        m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", gpu_list[0]["name"])
        if m:
            return m.group(1).lower()
        return re.sub(r"[^a-z0-9]+", "-", gpu_list[0]["name"].lower()).strip("-")
    return f"cpu-{_cores()}core"


def describe() -> dict[str, Any]:
    """Where and with what a result was measured.

    Returns a dict with ``commit`` (HEAD's full hash, None outside git), ``dirty`` (uncommitted changes to
    tracked files), ``date`` (UTC, ISO 8601), ``command``, ``machine`` (``machine_name()``), ``host`` (the
    hostname), ``cpu_count`` (usable cores), ``platform``, ``gpus`` (``gpus()``), ``versions`` (Python,
    opforge, ``VERSIONED``, torch's CUDA build), ``filter_logic`` (each filter's ``version``, name ->
    int, ``opforge.filters.chain.filter_versions``: verdicts of equal versions are comparable) and
    ``composer`` (``opforge.compose.composer.GENERATOR``).
    """
    gpu_list = gpus()
    from opforge.engine.ledger import dist_version

    versions: dict[str, Any] = {"python": platform.python_version(), "opforge": dist_version("opforge")}
    versions.update({d: dist_version(d) for d in VERSIONED})
    try:
        import torch

        versions["torch_cuda"] = torch.version.cuda
    except ImportError:
        versions["torch_cuda"] = None
    try:
        from opforge.filters.chain import FILTER_NAMES, filter_versions

        filter_logic = filter_versions(list(FILTER_NAMES))
    except ImportError:
        filter_logic = None  # an opforge without the filter stage
    try:
        from opforge.compose.composer import GENERATOR
    except ImportError:
        GENERATOR = None  # noqa: N806
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(dirty) if dirty is not None else None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": _command(),
        "machine": machine_name(gpu_list),
        "host": socket.gethostname(),
        "cpu_count": _cores(),
        "platform": platform.platform(),
        "gpus": gpu_list,
        "versions": versions,
        "filter_logic": filter_logic,
        "composer": GENERATOR,
    }


def write(name: str, payload: dict[str, Any], machine: str | None = None) -> Path:
    """Write ``{"provenance": describe(), **payload}`` to ``RESULTS/<machine>/<name>.json`` (``machine``
    defaults to ``describe()["machine"]``) and return the path. A ``provenance`` dict already in
    ``payload`` is merged over the described one (for facts only the script knows, e.g. the device used).

    Raises:
        ValueError: ``name`` or ``machine`` is empty or holds a path separator.
    """
    prov = describe()
    if isinstance(payload.get("provenance"), dict):
        prov.update(payload["provenance"])
    machine = machine or prov["machine"]
    name = name.removesuffix(".json")
    for what, value in (("name", name), ("machine", machine)):
        if not value or "/" in value or os.sep in value:
            raise ValueError(f"record.write: bad {what} {value!r} (a plain file / folder name)")
    prov["machine"] = machine
    return write_file(RESULTS / machine / f"{name}.json", {**payload, "provenance": prov})


def write_file(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``{"provenance": describe(), **payload}`` to ``path`` (a scratch copy outside ``RESULTS``, e.g.
    on a lent machine); a ``provenance`` dict in ``payload`` is merged over the described one. Atomic."""
    prov = describe()
    if isinstance(payload.get("provenance"), dict):
        prov.update(payload["provenance"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"provenance": prov, **{k: v for k, v in payload.items() if k != "provenance"}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
