"""What every extension build of one torch, compiler and GPU shares: flags, a precompiled header, the
fixed binding's object. Built once, in the build child (``harness.child``), kept in the toolchain cache.

A toolchain is one *flavour* (``cpu``: g++ only; ``cuda``: g++ and nvcc) of one environment. Its folder
``<root>/<flavour>-<key>`` (``root`` default ``$OPFORGE_CACHE/toolchain``, i.e.
``~/.cache/opforge/toolchain``; ``key``: SHA-256 over the torch version and folder, the compilers' versions,
the GPUs' compute capabilities, the environment variables that change torch's flags and this module's
layout version) holds:

* ``toolchain.json``: the compiler commands and flags that ``torch.utils.cpp_extension.load`` would use for
  the same sources in this environment (``cflags``, ``cuda_cflags``, ``cuda_post_cflags``, ``ldflags``: read
  from the ninja file that torch writes for them, so a torch release that changes its flags changes them here
  too), plus ``-O3`` as the harness always passed;
* ``pch/torch_extension.h`` and its GCC precompiled header ``torch_extension.h.gch`` (``#include
  <torch/extension.h>`` compiled once with ``cflags``); a C++ source that starts with an ``#include`` is
  compiled with ``-include pch/torch_extension.h``, so the torch and pybind11 headers are read from the
  precompiled form instead of being parsed again (about 20 s per source on 2 cores);
* ``binding.o``: the harness's fixed ``kernels/binding.cpp`` (``templates/``) compiled once;
* ``pch/lite/`` (``templates/lite``: the light torch headers) and ``lite_binding.o`` (``templates/lite_binding.cpp``,
  the real torch behind them), with the flags less torch's and Python's include folders (``lite_cflags``,
  ``lite_cuda_cflags``): what a build against the light headers (``harness.child``) uses.

Only trusted files go in (torch's headers, the harness's templates); candidate sources are never compiled
here. The folder is written under a lock and published by writing ``toolchain.json`` last, so concurrent
builds wait for the first and never read a half-made toolchain.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

LAYOUT = 2  # bump when the folder's content or the flags' derivation changes
TEMPLATES = Path(__file__).resolve().parent / "templates"
# environment variables that change the flags torch.utils.cpp_extension derives
# (CUDA_VISIBLE_DEVICES is not one: what it changes, the visible GPUs' compute capabilities, is keyed itself, so a
# Dask worker pinned to one of eight equal GPUs shares the toolchain of the process that made it)
FLAG_ENV = ("TORCH_CUDA_ARCH_LIST", "CXX", "CC", "CUDA_HOME", "CUDA_PATH", "TORCH_DONT_CHECK_COMPILER_ABI")


def toolchain_root() -> Path:
    """``$OPFORGE_CACHE/toolchain`` (default ``~/.cache/opforge/toolchain``)."""
    return Path(os.environ.get("OPFORGE_CACHE", Path.home() / ".cache" / "opforge")) / "toolchain"


def _run(cmd: list[str], timeout: float = 30.0) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "missing"


def toolchain_key(flavour: str) -> str:
    """SHA-256 (hex) of what decides a toolchain's flags and files, found without importing torch
    (about 0.1 s: ``c++ -dumpfullversion``, and for ``cuda`` ``nvcc --version`` and ``nvidia-smi``'s compute
    capabilities)."""
    spec = importlib.util.find_spec("torch")
    facts = {
        "layout": LAYOUT, "flavour": flavour, "python": sys.version, "executable": sys.executable,
        "torch": importlib.metadata.version("torch"), "torch_dir": str(Path(spec.origin).parent) if spec else None,
        "cxx": _run([os.environ.get("CXX", "c++"), "-dumpfullversion", "-dumpversion"]),
        "env": {k: os.environ.get(k) for k in FLAG_ENV},
        "templates": {p.relative_to(TEMPLATES).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in sorted(TEMPLATES.rglob("*")) if p.is_file() and p.suffix in (".h", ".cpp")},
    }
    if flavour == "cuda":
        facts["nvcc"] = _run([_nvcc(), "--version"])
        facts["gpus"] = visible_compute_caps()
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def visible_compute_caps() -> list[str] | str:
    """The distinct compute capabilities (``"9.0"``...) of the GPUs this process may use, sorted: those
    ``nvidia-smi`` lists, narrowed to the entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) when it is set;
    ``"missing"`` without ``nvidia-smi``. torch builds for exactly these when ``TORCH_CUDA_ARCH_LIST`` is unset."""
    out = _run(["nvidia-smi", "--query-gpu=index,uuid,compute_cap", "--format=csv,noheader"])
    if out == "missing":
        return out
    from opforge.engine.gpu_locks import visible_gpu_ids

    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.count(",") == 2]
    wanted = visible_gpu_ids()
    if wanted is not None:
        rows = [r for r in rows if any(w == r[0] or (w.startswith(("GPU-", "MIG-")) and r[1].startswith(w))
                                       for w in wanted)]
    return sorted({r[2] for r in rows})


def _nvcc() -> str:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def _ninja_flags(flavour: str, build_dir: Path) -> dict[str, list[str] | str]:
    """The commands and flags ``torch.utils.cpp_extension.load(name="opforge_kernels", extra_cflags=["-O3"])``
    would use here, from the ninja file torch writes for a C++ (and a CUDA) source."""
    from torch.utils import cpp_extension as ce

    with_cuda = flavour == "cuda"
    sources = [str(build_dir / "probe.cpp")] + ([str(build_dir / "probe.cu")] if with_cuda else [])
    def call(fn, **kwargs):  # torch's private helpers gain parameters between releases (with_sycl in 2.7)
        return fn(**{k: v for k, v in kwargs.items() if k in inspect.signature(fn).parameters})

    ldflags = call(ce._prepare_ldflags, extra_ldflags=[], with_cuda=with_cuda, with_sycl=False, verbose=False,
                   is_standalone=False)
    call(ce._write_ninja_file_to_build_library,
         path=str(build_dir / "build.ninja"), name="opforge_kernels", sources=sources, extra_cflags=["-O3"],
         extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=ldflags, extra_include_paths=[],
         with_cuda=with_cuda, with_sycl=False, is_standalone=False)
    values: dict[str, str] = {}
    for line in (build_dir / "build.ninja").read_text().splitlines():
        name, sep, value = line.partition(" = ")
        if sep and not line.startswith(" ") and name.isidentifier():
            values[name] = value.replace("$$", "$")
    out: dict[str, list[str] | str] = {k: shlex.split(values.get(k, "")) for k in
                                       ("cflags", "post_cflags", "cuda_cflags", "cuda_post_cflags", "ldflags")}
    out["cxx"] = shlex.split(values["cxx"])
    out["nvcc"] = shlex.split(values["nvcc"]) if with_cuda else []
    return out


def _check(cmd: list[str], log, what: str) -> None:
    print("$ " + shlex.join(cmd), file=log, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout + f"[{what}: {time.perf_counter() - t0:.1f} s, exit {proc.returncode}]", file=log, flush=True)
    if proc.returncode:
        raise RuntimeError(f"toolchain: {what} failed (exit {proc.returncode}): {proc.stdout[-1500:]}")


def ensure_toolchain(flavour: str, root: str | Path | None = None, log=None) -> dict:
    """The toolchain of ``flavour`` (``cpu`` or ``cuda``) for this environment, made when missing (one torch
    import, one precompiled header, one compile of the fixed binding: about the CPU of two plain builds, once).

    Returns ``toolchain.json``'s content: ``key``, ``dir``, ``cxx``, ``nvcc`` (command lists), ``cflags``,
    ``post_cflags``, ``cuda_cflags``, ``cuda_post_cflags``, ``ldflags`` (flag lists), ``pch`` (the header
    to ``-include``) and ``binding_obj`` (path), the light-header build's ``lite_include``, ``lite_binding_obj``
    (None when it could not be made), ``lite_defines``, ``lite_cflags``, ``lite_cuda_cflags``, and ``seconds``
    (what making it took).

    Raises:
        ValueError: an unknown flavour.
        RuntimeError: the precompiled header or the binding does not compile (the message holds the tail
            of the compiler's output).
    """
    if flavour not in ("cpu", "cuda"):
        raise ValueError(f"toolchain flavour {flavour!r}: expected 'cpu' or 'cuda'")
    log = log or sys.stdout
    key = toolchain_key(flavour)
    folder = Path(root or toolchain_root()) / f"{flavour}-{key[:20]}"
    done = folder / "toolchain.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "make.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return json.loads(done.read_text())
        t0 = time.perf_counter()
        print(f"toolchain {flavour}: making {folder}", file=log, flush=True)
        probe = folder / "probe"
        probe.mkdir(exist_ok=True)
        flags = _ninja_flags(flavour, probe)
        pch_dir = folder / "pch"
        pch_dir.mkdir(exist_ok=True)
        header = pch_dir / "torch_extension.h"
        header.write_text("// opforge: precompiled torch extension headers\n#include <torch/extension.h>\n")
        cxx, cflags = flags["cxx"], flags["cflags"]
        _check([*cxx, *cflags, "-x", "c++-header", str(header), "-o", str(header) + ".gch.tmp",
                *flags["post_cflags"]], log, "precompiled header")
        os.replace(str(header) + ".gch.tmp", str(header) + ".gch")
        shutil.copy(TEMPLATES / "registry.h", pch_dir / "registry.h")
        shutil.copy(TEMPLATES / "binding.cpp", pch_dir / "binding.cpp")
        binding = folder / "binding.o"
        _check([*cxx, *cflags, "-include", str(header), "-Winvalid-pch", "-c", str(pch_dir / "binding.cpp"),
                "-o", str(binding) + ".tmp", *flags["post_cflags"]], log, "fixed binding")
        os.replace(str(binding) + ".tmp", binding)
        lite = _make_lite(flavour, flags, folder, pch_dir, header, log)
        record = {"key": key, "flavour": flavour, "dir": str(folder), **flags, "pch": str(header),
                  "binding_obj": str(binding), **lite, "seconds": time.perf_counter() - t0}
        tmp = folder / "toolchain.json.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, done)
        print(f"toolchain {flavour}: made in {record['seconds']:.1f} s", file=log, flush=True)
        return record


def strip_torch_includes(flags: list[str]) -> list[str]:
    """``flags`` without the include folders of torch and of Python (``-I`` / ``-isystem``, joined or as two
    words): what a source built against the light headers (``templates/lite``) gets, so a torch header the
    light set lacks is a compile error there instead of the full header."""
    import sysconfig

    torch_dir = Path(importlib.util.find_spec("torch").origin).parent.resolve()
    py_inc = {str(Path(p).resolve()) for p in (sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"])}

    def dropped(path: str) -> bool:
        p = Path(path).resolve()
        return str(p) in py_inc or p == torch_dir or torch_dir in p.parents

    out: list[str] = []
    skip = False
    for i, f in enumerate(flags):
        if skip:
            skip = False
            continue
        if f in ("-I", "-isystem") and i + 1 < len(flags):
            if dropped(flags[i + 1]):
                skip = True
                continue
        elif f.startswith("-isystem") and len(f) > 8 and dropped(f[8:]):
            continue
        elif f.startswith("-I") and len(f) > 2 and dropped(f[2:]):
            continue
        out.append(f)
    return out


def _make_lite(flavour: str, flags: dict, folder: Path, pch_dir: Path, header: Path, log) -> dict:
    """The light-header build's part of the toolchain: ``templates/lite`` copied to ``pch/lite``
    (``lite_include``), ``lite_binding.o`` (``templates/lite_binding.cpp`` compiled with the precompiled torch
    header: the real torch behind ``opforge_lite_abi.h``) and the flags without torch's include folders
    (``lite_cflags``, ``lite_cuda_cflags``). When the binding does not compile, ``lite_binding_obj`` is None
    and every build takes the full headers (the reason is in the toolchain log)."""
    lite_dir = pch_dir / "lite"
    cuda = ["-DOPFORGE_LITE_CUDA"] if flavour == "cuda" else []
    obj = folder / "lite_binding.o"
    try:
        if lite_dir.exists():
            shutil.rmtree(lite_dir)
        shutil.copytree(TEMPLATES / "lite", lite_dir)
        shutil.copy(TEMPLATES / "lite_binding.cpp", pch_dir / "lite_binding.cpp")
        _check([*flags["cxx"], *flags["cflags"], *cuda, "-include", str(header), "-Winvalid-pch", "-c",
                str(pch_dir / "lite_binding.cpp"), "-o", str(obj) + ".tmp", *flags["post_cflags"]], log,
               "light-header binding")
        os.replace(str(obj) + ".tmp", obj)
    except (RuntimeError, OSError) as exc:  # the binding does not compile, or the templates are missing
        print(f"toolchain {flavour}: no light-header builds ({exc})", file=log, flush=True)
        obj = None
    return {"lite_include": str(lite_dir), "lite_binding_obj": str(obj) if obj else None,
            "lite_defines": cuda, "lite_cflags": strip_torch_includes(flags["cflags"]),
            "lite_cuda_cflags": strip_torch_includes(flags["cuda_cflags"]) if flavour == "cuda" else []}
