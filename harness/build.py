"""Build a solution's ``kernels/`` into a Python extension (``torch.utils.cpp_extension``), sandboxed.

C++ only (CPU) or with ``.cu`` files (CUDA, nvcc). The module is named ``opforge_kernels``; the build
directory is keyed by the SHA-256 of the sources, so the same sources are built once per cache.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from opforge.harness.sandbox import run_child
from opforge.harness.solution import MODULE_NAME, Solution


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


def build_extension(solution: Solution, build_root: str | Path | None = None, timeout_s: float = 600.0
                    ) -> BuildResult:
    """Compile ``solution.sources`` in a child process (see ``harness.sandbox``).

    Returns ``BuildResult(ok=True, module_path=None)`` when the solution has no sources.
    Raises nothing for compiler failures: they come back as ``ok=False`` with the error.
    """
    if not solution.sources:
        return BuildResult(True, None, 0.0)
    build_dir = Path(build_root or default_build_root()) / solution.digest()[:24]
    so = _built(build_dir)
    if so is not None:
        return BuildResult(True, str(so), 0.0, cached=True)
    src_dir = build_dir / "src"
    for rel, text in solution.sources.items():
        (src_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (src_dir / rel).write_text(text, encoding="utf-8")
    request = {"sources": [str(src_dir / r) for r in solution.sources if not r.endswith((".h", ".hpp", ".cuh"))],
               "build_dir": str(build_dir), "name": MODULE_NAME, "with_cuda": solution.uses_cuda}
    out, seconds = run_child("build", request, build_dir, timeout_s)
    so = _built(build_dir) if out.get("ok") else None
    return BuildResult(bool(so), str(so) if so else None, seconds, error=None if so else out.get("error"),
                       log=out.get("log"))
