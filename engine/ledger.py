"""The engine's ledger: one JSON line per finished work item, appended as results arrive.

A ledger file (``RUN_DIR/ledger.jsonl`` of a filter run, ``OUT/results.jsonl`` of an evaluation) is the
run's source of truth. A record is keyed by its ``key`` field (a filter run: ``task_id``, itself the task's
content hash unless the input names it; an evaluation: task id + hash of the task's code and the
solution's files) and by the ``fingerprint`` of the settings and the environment it was made under; a
re-started run reads the ledger, skips every item already recorded under the same fingerprint and appends
the rest, so a killed run loses at most the items that were in flight, and a changed input, setting or
library version is never served an old record. A line cut short by a kill is ignored when read (and
reported), never fatal.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats turned into the strings "inf", "-inf" and "nan" (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (``importlib.metadata``), None when not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def gpus() -> list[dict[str, str]]:
    """One dict per GPU ``nvidia-smi`` lists (``index``, ``name``, ``memory_mib``, ``driver``); empty without
    NVIDIA's tools or GPUs. Never initialises CUDA. Honours ``CUDA_VISIBLE_DEVICES`` only as far as
    ``nvidia-smi`` does (not)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append({"index": parts[0], "name": parts[1], "memory_mib": parts[2], "driver": parts[3]})
    return rows


def gpu_names() -> list[str]:
    """GPU model names from ``nvidia-smi`` (``gpus``; empty when there is none). Never initialises CUDA."""
    return [g["name"] for g in gpus()]


@functools.cache
def visible_gpu_name() -> str | None:
    """Model name of this process's GPU: ``nvidia-smi``'s entry at the first index of
    ``CUDA_VISIBLE_DEVICES`` (the first GPU when it is unset or not an index); None without one. Never
    initialises CUDA (``gpus``)."""
    listed = gpus()
    if not listed:
        return None
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    for g in listed:
        if first.isdigit() and g["index"] == first:
            return g["name"]
    return listed[0]["name"]


def environment(device: str) -> dict[str, Any]:
    """What results depend on besides the item and the settings: library versions, Python, machine, device
    model (the versions of the deciding logic are the callers' settings: per filter, the grader's)."""
    env = {"torch": dist_version("torch"), "transformers": dist_version("transformers"), "triton": dist_version("triton"),
           "python": platform.python_version(), "machine": platform.machine(), "device": device}
    if device == "cuda":
        names = gpu_names()
        env["gpu"] = names[0] if names else None
    return env


def fingerprint(env: dict[str, Any], settings_fields: dict[str, Any]) -> str:
    """16 hex digits of SHA-256 over the environment and the verdict-relevant settings."""
    blob = json.dumps({"env": env, "settings": settings_fields}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def content_hash(*parts: Any) -> str:
    """16 hex digits of SHA-256 over ``parts`` (JSON-able: strings, dicts of file name -> text...)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Ledger:
    """Append-only JSONL of records in ``path``.

    Each record holds at least its ``key`` field (default ``task_id``) and ``fingerprint``; a filter run's
    also ``accepted``, ``reason``, ``filter``, ``metrics``, ``seconds``. ``done`` maps key -> record for
    this fingerprint (the first one written).
    """

    def __init__(self, path: str | Path, fingerprint: str, key: str = "task_id"):
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.key = key
        self.done: dict[str, dict[str, Any]] = {}
        self.truncated_lines = 0
        self._load()
        self._fh = None

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.truncated_lines += 1  # a write cut by a kill
                    continue
                if isinstance(rec, dict) and rec.get("fingerprint") == self.fingerprint and self.key in rec:
                    self.done.setdefault(rec[self.key], rec)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (one line, flushed and fsynced) unless its key is already in the ledger."""
        if record[self.key] in self.done:
            return
        record = json_safe({**record, "fingerprint": self.fingerprint})
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_tail()
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across appends
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done[record[self.key]] = record

    def _repair_tail(self) -> None:
        """Terminate a line cut short by a kill so the next record starts on its own line."""
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb+") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
