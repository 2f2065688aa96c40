"""A candidate solution: ``model_new.py`` (defines ``ModelNew``) plus optional extension sources.

Layout (a directory, or the same paths inside an LLM completion, see ``extract_solution``)::

    model_new.py            class ModelNew(torch.nn.Module), built with the task's get_init_inputs()
    kernels/*.cpp|*.cu|*.h  C++ / CUDA sources compiled into one extension; one of them holds the
                            PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) binding. model_new.py imports the
                            built module as ``import opforge_kernels``.

Nothing else in a solution is read; workspace files such as ``model.py`` or ``tools/`` are protected and
never taken from the candidate.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

EXTENSION_SUFFIXES = (".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp")
MODULE_NAME = "opforge_kernels"


class SolutionError(ValueError):
    """A solution is malformed; the message names the file or the completion part at fault."""


@dataclass
class Solution:
    """Solution files as ``{relative posix path: text}``.

    Attributes:
        files: ``model_new.py`` and ``kernels/...`` sources (other paths are rejected).
        origin: where it came from (directory, ``completion``), for messages.
    """

    files: dict[str, str]
    origin: str = "<solution>"
    ignored: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        clean: dict[str, str] = {}
        for path, text in self.files.items():
            p = PurePosixPath(path.strip().lstrip("./"))
            if ".." in p.parts or p.is_absolute():
                raise SolutionError(f"{self.origin}: path {path!r} leaves the solution directory")
            key = str(p)
            if key == "model_new.py" or (p.parts[0] == "kernels" and p.suffix in EXTENSION_SUFFIXES
                                         and len(p.parts) >= 2):
                clean[key] = text
            else:
                self.ignored.append(key)
        if "model_new.py" not in clean:
            raise SolutionError(f"{self.origin}: no model_new.py")
        self.files = dict(sorted(clean.items()))

    @property
    def model_new(self) -> str:
        return self.files["model_new.py"]

    @property
    def sources(self) -> dict[str, str]:
        """Extension sources (``kernels/...``)."""
        return {k: v for k, v in self.files.items() if k.startswith("kernels/")}

    @property
    def uses_cuda(self) -> bool:
        return any(k.endswith((".cu", ".cuh")) for k in self.files)

    @classmethod
    def from_dir(cls, path: str | Path) -> Solution:
        """Read ``model_new.py`` and ``kernels/**`` from a directory. Raises SolutionError when the
        directory or its ``model_new.py`` is missing."""
        root = Path(path)
        if not root.is_dir():
            raise SolutionError(f"{root}: not a directory")
        files = {}
        if (root / "model_new.py").is_file():
            files["model_new.py"] = (root / "model_new.py").read_text(encoding="utf-8")
        if (root / "kernels").is_dir():
            for f in sorted((root / "kernels").rglob("*")):
                if f.is_file() and f.suffix in EXTENSION_SUFFIXES:
                    files[f.relative_to(root).as_posix()] = f.read_text(encoding="utf-8")
        return cls(files, origin=str(root))

    def write_to(self, path: str | Path) -> Path:
        """Write the files under ``path`` (created); returns it."""
        root = Path(path)
        for rel, text in self.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        return root


def sources_digest(sources: dict[str, str]) -> str:
    """SHA-256 (hex) over ``{path: text}`` in path order: the extension build cache key."""
    h = hashlib.sha256()
    for k, v in sorted(sources.items()):
        h.update(k.encode() + b"\0" + v.encode() + b"\0")
    return h.hexdigest()


# A fenced block whose info string or first line names the file:  ```cpp kernels/fused.cpp   or
# ```python\n# file: model_new.py
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.S)
_NAME_IN_INFO = re.compile(r"([\w./-]+\.(?:py|cpp|cc|cu|cuh|h|hpp))\s*$")
_NAME_IN_LINE = re.compile(r"^\s*(?://|#)\s*(?:file|path)\s*:\s*([\w./-]+)\s*$", re.I)


def extract_solution(completion: str) -> Solution:
    """Solution files from a model completion (the format the workspace's RULES.md asks for).

    Each file is one fenced code block whose info string ends with the path (```` ```cpp kernels/a.cu ````)
    or whose first line is a ``// file: PATH`` / ``# file: PATH`` comment. A later block for the same path
    replaces an earlier one. Raises SolutionError when no ``model_new.py`` block is found.
    """
    files: dict[str, str] = {}
    for info, body in _FENCE.findall(completion or ""):
        name = None
        m = _NAME_IN_INFO.search(info.strip())
        if m:
            name = m.group(1)
        else:
            first, _, rest = body.partition("\n")
            m = _NAME_IN_LINE.match(first)
            if m:
                name, body = m.group(1), rest
        if name:
            files[name] = body
    return Solution(files, origin="completion")


def format_completion(files: dict[str, str], preamble: str = "") -> str:
    """``files`` as a reply in the answer format ``extract_solution`` reads (one fenced block per file, the
    path after the language) - for examples, tests and benchmarks."""
    blocks = [f"```{'python' if path.endswith('.py') else 'cpp'} {path}\n{text}```" for path, text in files.items()]
    return "\n\n".join([preamble, *blocks] if preamble else blocks)
