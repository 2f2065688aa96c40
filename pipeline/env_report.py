"""``opforge env``: what a bug report needs about this machine: versions, GPUs and cache folders.

Nothing here initialises CUDA: GPUs are read with ``nvidia-smi`` (name, memory, driver); torch's CUDA build
is read from ``torch.version.cuda``.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from opforge.engine.ledger import dist_version, gpus

# Distributions whose versions matter to opforge's results or its bugs, in report order.
DISTRIBUTIONS = ("opforge", "torch", "triton", "transformers", "datasets", "huggingface_hub", "dask",
                 "distributed", "dask-cuda", "typer", "pydantic", "pandas", "pyarrow", "numpy", "networkx",
                 "datasketch", "rapidfuzz", "trl")


def cache_dirs() -> dict[str, str]:
    """Cache folders opforge and its libraries write to (whether or not they exist yet)."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    out: dict[str, str] = {}
    try:
        from huggingface_hub import constants

        out["huggingface_hub"] = str(constants.HF_HUB_CACHE)
    except ImportError:
        out["huggingface_hub"] = str(Path(os.environ.get("HF_HOME") or xdg / "huggingface") / "hub")
    out["datasets"] = os.environ.get("HF_DATASETS_CACHE") or str(
        Path(os.environ.get("HF_HOME") or xdg / "huggingface") / "datasets")
    out["torch_extensions"] = os.environ.get("TORCH_EXTENSIONS_DIR") or str(xdg / "torch_extensions")
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

        out["inductor"] = inductor_cache_dir()
    except Exception:  # noqa: BLE001 - private torch API: absent or moved in other versions
        out["inductor"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "(torch default)"
    from opforge.filters.kernelbench import cache_dir

    out["opforge"] = str(cache_dir())
    return out


def collect() -> dict[str, Any]:
    """Versions (``DISTRIBUTIONS``, Python, OS), torch's CUDA / cuDNN build, GPUs, usable cores, memory,
    cache folders and the opforge settings read from the environment (``OPFORGE_*``, ``HF_HUB_OFFLINE``)."""
    import psutil

    info: dict[str, Any] = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "versions": {d: dist_version(d) for d in DISTRIBUTIONS},
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    try:
        import torch

        info["torch_build"] = {"cuda": torch.version.cuda, "cudnn": _cudnn(torch), "git": torch.version.git_version[:12]}
    except ImportError:
        info["torch_build"] = None
    info["gpus"] = gpus()
    info["caches"] = cache_dirs()
    from opforge.filters.kernelbench import default_reference

    info["kernelbench_reference"] = default_reference()
    info["settings"] = {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("OPFORGE_") or k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                              "CUDA_VISIBLE_DEVICES", "HF_HOME")}
    return info


def _cudnn(torch) -> str | None:
    try:
        v = torch.backends.cudnn.version()
        return str(v) if v else None
    except Exception:  # noqa: BLE001 - a CPU build has no cuDNN
        return None


def format_env(info: dict[str, Any]) -> str:
    """``collect()`` as aligned ``key: value`` lines, ready to paste into an issue."""
    lines = [f"python: {info['python']}", f"platform: {info['platform']}",
             f"cores (usable): {info['cores_usable']}, memory: {info['memory_gib']} GiB"]
    lines += [f"{d}: {v}" for d, v in info["versions"].items() if v is not None]
    missing = [d for d, v in info["versions"].items() if v is None]
    if missing:
        lines.append("not installed: " + ", ".join(missing))
    tb = info.get("torch_build")
    if tb:
        lines.append(f"torch build: CUDA {tb['cuda'] or 'none (CPU build)'}, cuDNN {tb['cudnn'] or 'none'}, "
                     f"git {tb['git']}")
    if info["gpus"]:
        lines += [f"GPU {g['index']}: {g['name']}, {g['memory_mib']} MiB, driver {g['driver']}" for g in info["gpus"]]
    else:
        lines.append("GPUs: none found (nvidia-smi absent or lists none)")
    lines.append(f"KernelBench reference (contamination default): {info['kernelbench_reference']}")
    lines += [f"cache {k}: {v}" for k, v in info["caches"].items()]
    lines += [f"env {k}={v}" for k, v in info["settings"].items()]
    return "\n".join(lines)
