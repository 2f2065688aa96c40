"""Build a solution's ``kernels/`` into a Python extension, sandboxed (``harness.child``).

C++ only (CPU) or with ``.cu`` files (CUDA, nvcc), with the flags of ``torch.utils.cpp_extension.load``.
The module is named ``opforge_kernels``; the build directory is keyed by the SHA-256 of the sources and
the extra flags, so the same sources are built once per cache. Inside a build, the fixed binding's object
and a precompiled torch header come from the toolchain cache (``harness.toolchain``) and each source's
object from ``<build_root>/objects`` (keyed by its text, the solution's headers and the flags), so a
changed source is compiled again and nothing else is.

Sources that register functions with ``OPFORGE_EXPORT`` (``templates/registry.h``) get the harness's own
``kernels/binding.cpp`` and ``kernels/registry.h``, whatever the solution holds under those names; sources
with their own ``PYBIND11_MODULE`` are built as they are.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from opforge.engine.oneshot import run_child
from opforge.harness.libraries import LibraryError, build_options
from opforge.harness.solution import MODULE_NAME, Solution, sources_digest

TEMPLATES = Path(__file__).resolve().parent / "templates"
FIXED_BINDING = ("kernels/binding.cpp", "kernels/registry.h")


def extension_sources(solution: Solution) -> dict[str, str]:
    """The files to compile: the solution's sources, with the fixed binding files put in (replacing any
    of the same name) unless a source defines its own ``PYBIND11_MODULE``."""
    sources = dict(solution.sources)
    own_module = any("PYBIND11_MODULE" in text for rel, text in sources.items() if rel not in FIXED_BINDING)
    if sources and not own_module:
        for rel in FIXED_BINDING:
            sources[rel] = (TEMPLATES / Path(rel).name).read_text(encoding="utf-8")
    return sources


@dataclass
class BuildResult:
    """``ok``; ``module_path`` (the built ``.so``, None without sources); ``seconds`` (wall, 0 when
    cached); ``cached``; ``error`` (compiler message tail); ``log`` (full build log path)."""

    ok: bool
    module_path: str | None
    seconds: float
    cached: bool = False
    error: str | None = None
    log: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def default_build_root() -> Path:
    """``$OPFORGE_CACHE/extensions`` (default ``~/.cache/opforge/extensions``)."""
    return Path(os.environ.get("OPFORGE_CACHE", Path.home() / ".cache" / "opforge")) / "extensions"


def _built(build_dir: Path) -> Path | None:
    found = sorted(build_dir.glob(f"{MODULE_NAME}*.so"))
    return found[0] if found else None


def build_extension(solution: Solution, build_root: str | Path | None = None, timeout_s: float = 600.0,
                    extra_include_paths: list[str] | None = None, extra_ldflags: list[str] | None = None,
                    toolchain_root: str | Path | None = None, route: str | None = None) -> BuildResult:
    """Compile ``solution.sources`` in a child process (see ``engine.oneshot``).

    ``extra_include_paths`` (``-I`` folders for every source) and ``extra_ldflags`` (link flags: ``-L``,
    ``-l``, ``-Wl,-rpath,...``) are added to those of the allowed libraries the sources use
    (``harness.libraries.build_options``: cuBLAS, cuBLASLt, cuDNN); all are part of the cache key. A library
    the sources use that is not installed is a failed build naming it (``LibraryError``).
    ``toolchain_root``: the toolchain cache (default ``harness.toolchain.toolchain_root()``). ``route``:
    ``objects`` (default; ``$OPFORGE_BUILD_ROUTE`` when set) or ``load`` (``torch.utils.cpp_extension.load``,
    for comparison). ``objects`` tries the light torch headers first (``harness.child``);
    ``OPFORGE_BUILD_LITE=0`` skips them (a module already in the cache is served either way: both routes build
    the same module).

    Returns ``BuildResult(ok=True, module_path=None)`` when the solution has no sources.
    Raises nothing for compiler failures: they come back as ``ok=False`` with the error.
    """
    if not solution.sources:
        return BuildResult(True, None, 0.0)
    sources = extension_sources(solution)
    route = route or os.environ.get("OPFORGE_BUILD_ROUTE") or "objects"
    if route not in ("objects", "load"):
        raise ValueError(f"build route {route!r}: expected 'objects' or 'load'")
    # the allowed libraries (cuBLAS / cuBLASLt / cuDNN) the sources use: their headers and link flags
    try:
        libs = build_options(solution.sources)
    except LibraryError as exc:
        return BuildResult(False, None, 0.0, error=f"LibraryError: {exc}")
    extras = {"extra_include_paths": [str(p) for p in [*(extra_include_paths or []), *libs["extra_include_paths"]]],
              "extra_ldflags": [str(f) for f in [*(extra_ldflags or []), *libs["extra_ldflags"]]]}
    # the digest of the sources alone when nothing is added, so caches made before extras existed still hit
    keyed = dict(sources, **{f"\0{k}": json.dumps(v) for k, v in extras.items() if v})
    build_dir = Path(build_root or default_build_root()) / sources_digest(keyed)[:24]
    build_dir.mkdir(parents=True, exist_ok=True)
    # one build per source set: concurrent evaluations of the same sources wait for the first build
    with open(build_dir / "build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.perf_counter()
        so = _built(build_dir)
        if so is not None:
            return BuildResult(True, str(so), 0.0, cached=True)
        request = {**extras, "route": route, "object_dir": str(build_dir.parent / "objects"),
                   "lite": os.environ.get("OPFORGE_BUILD_LITE", "1") != "0",
                   "toolchain_root": str(toolchain_root) if toolchain_root else None}
        result = _build(sources, build_dir, solution.uses_cuda, timeout_s, request)
        result.seconds = time.perf_counter() - t0
        return result


def _build(sources: dict[str, str], build_dir: Path, with_cuda: bool, timeout_s: float, extra: dict) -> BuildResult:
    src_dir = build_dir / "src"
    for rel, text in sources.items():
        (src_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (src_dir / rel).write_text(text, encoding="utf-8")
    request = {"sources": [str(src_dir / r) for r in sources if not r.endswith((".h", ".hpp", ".cuh"))],
               "build_dir": str(build_dir), "name": MODULE_NAME, "with_cuda": with_cuda, **extra}
    out, seconds = run_child("opforge.harness.child", "build", request, build_dir, timeout_s)
    so = _built(build_dir) if out.get("ok") else None
    return BuildResult(bool(so), str(so) if so else None, seconds, error=None if so else out.get("error"),
                       log=out.get("log"))
