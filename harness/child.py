"""Build step child of the harness: ``python -m opforge.harness.child build REQUEST.json RESULT.json``.

Compiles the request's sources into ``<build_dir>/opforge_kernels.so`` and writes one JSON result
(``{"ok": true}`` or ``{"ok": false, "error": ...}``); every command and the compilers' output go to stdout
(the build log). Candidate code is compiled here, never run (it runs in ``harness.server``'s candidate role).

Route ``objects`` (the default): the flags of ``torch.utils.cpp_extension.load`` (``harness.toolchain``),
one compiler process per source, then one link. First against the light torch headers (``templates/lite``,
``_lite_build``; request ``"lite": false`` skips it), then, when a source needs more of torch than they hold,
against the full headers:

* the harness's fixed ``kernels/binding.cpp`` is never compiled: the toolchain's ``binding.o`` is linked;
* a C++ source whose first preprocessor directive is an ``#include`` is compiled with the toolchain's
  precompiled torch / pybind11 header (``-include``; the source's own ``#include <torch/extension.h>`` is
  then a no-op), any other C++ source, and every ``.cu`` source (nvcc), as it is;
* each object is kept in ``object_dir`` under the SHA-256 of the toolchain key, the compiler and flags, the
  source's path and text and the text of every header of the solution, so an unchanged source is not
  compiled again and a changed one (or a changed header) always is.

Route ``load`` (request ``"route": "load"``, and the fallback when the toolchain cannot be made):
``torch.utils.cpp_extension.load``, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HEADER_SUFFIXES = (".h", ".hpp", ".cuh")
FIXED_FILES = ("kernels/binding.cpp", "kernels/registry.h")
TORCH_HEADER_ROOTS = ("torch", "ATen", "c10", "pybind11", "caffe2")
LITE_ROOT = Path(__file__).resolve().parent / "templates" / "lite"
LITE_HEADERS = frozenset(p.relative_to(LITE_ROOT).as_posix() for p in LITE_ROOT.rglob("*.h"))
LITE_REGISTRY = ("// opforge harness: registry.h of a light-header build (OPFORGE_EXPORT is in opforge_lite.h)\n"
                 "#pragma once\n#include <torch/extension.h>\n")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PTX_ONLY = re.compile(r"^-gencode=arch=compute_(\w+),code=compute_(\w+)$")


def _sass_only(flags: list[str]) -> list[str]:
    """``flags`` without the PTX copy (``-gencode=arch=compute_90,code=compute_90``) of an architecture whose
    machine code (``code=sm_90``) is built too: the module runs on the GPU that is present, so the copy that
    would serve later GPUs is only compile time."""
    return [f for f in flags if not ((m := _PTX_ONLY.match(f)) and m.group(1) == m.group(2)
                                     and f"-gencode=arch=compute_{m.group(1)},code=sm_{m.group(1)}" in flags)]


def pch_applies(text: str) -> bool:
    """Whether a C++ source may be compiled with the precompiled torch header forced in front of it: its
    first preprocessor directive (comments and ``#pragma once`` skipped) is an ``#include``, so no macro of
    the source is defined before torch's headers are read (GCC's condition for a precompiled header to mean
    the same as the text)."""
    for line in _COMMENTS.sub("", text).splitlines():
        s = line.strip()
        if not s.startswith("#"):
            continue
        words = s[1:].split()
        if not words:
            continue
        if words[0] == "pragma" and words[1:2] == ["once"]:
            continue
        return words[0] == "include" or s[1:].lstrip().startswith("include")
    return False


def _load_route(req: dict[str, Any]) -> dict[str, Any]:
    from torch.utils.cpp_extension import load

    # ninja (a dependency) lives next to this interpreter in a virtual environment that is not activated
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    try:
        load(name=req["name"], sources=req["sources"], build_directory=req["build_dir"],
             with_cuda=req["with_cuda"], extra_cflags=["-O3"], extra_ldflags=req.get("extra_ldflags") or [],
             extra_include_paths=req.get("extra_include_paths") or [], verbose=True)
    except Exception as exc:  # noqa: BLE001 - the compiler's message is the result
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
    return {"ok": True}


def _run(cmd: list[str]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    return proc.returncode, proc.stdout, time.perf_counter() - t0


def build(req: dict[str, Any]) -> dict[str, Any]:
    """Build ``req["sources"]`` (absolute paths under ``<build_dir>/src``) into ``<build_dir>/<name>.so``.

    Request keys: ``sources``, ``build_dir``, ``name``, ``with_cuda``; optional ``route`` (``objects`` /
    ``load``), ``object_dir`` (default ``<build_dir>/objects``), ``toolchain_root``
    (``harness.toolchain.toolchain_root()``), ``extra_include_paths`` (``-I`` folders for every source),
    ``extra_cflags`` (C++ sources), ``extra_cuda_cflags`` (``.cu`` sources), ``extra_ldflags`` (the link).
    """
    if req.get("route", "objects") == "load":
        return _load_route(req)
    from opforge.harness.toolchain import TEMPLATES, ensure_toolchain

    t_start = time.perf_counter()
    build_dir = Path(req["build_dir"])
    src_dir = build_dir / "src"
    try:
        tc = ensure_toolchain("cuda" if req["with_cuda"] else "cpu", req.get("toolchain_root"))
    except Exception:  # noqa: BLE001 - torch's private flag helpers changed, or its headers do not compile
        traceback.print_exc()
        print("the toolchain could not be made: building with torch.utils.cpp_extension.load", flush=True)
        return _load_route(req)
    t_toolchain = time.perf_counter() - t_start
    object_dir = Path(req.get("object_dir") or build_dir / "objects")
    object_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "obj").mkdir(exist_ok=True)
    includes = [f"-I{os.path.abspath(p)}" for p in req.get("extra_include_paths") or []]
    files = {p.relative_to(src_dir).as_posix(): p.read_text(errors="replace") for p in src_dir.rglob("*") if p.is_file()}
    headers = sorted((rel, text) for rel, text in files.items() if rel.endswith(HEADER_SUFFIXES))
    if req.get("lite", True) and tc.get("lite_binding_obj"):
        why = lite_blocker(files)
        if why is None:
            done = _lite_build(req, tc, build_dir, files, object_dir, includes, t_toolchain)
            if done is not None:
                return done
        else:
            print(f"light headers: not tried ({why}); full torch headers", flush=True)
    cuda_flags = _sass_only(tc["cuda_cflags"])
    fixed = {"kernels/binding.cpp": (TEMPLATES / "binding.cpp").read_text(),
             "kernels/registry.h": (TEMPLATES / "registry.h").read_text()}
    plan: list[tuple[str, Path, list[str] | None]] = []  # (rel, object path, command or None when cached)
    for path in map(Path, req["sources"]):
        rel = path.relative_to(src_dir).as_posix()
        text = path.read_text(errors="replace")
        if rel == "kernels/binding.cpp" and text == fixed[rel] and dict(headers).get("kernels/registry.h") == \
                fixed["kernels/registry.h"]:
            plan.append((rel, Path(tc["binding_obj"]), None))
            continue
        tmp_obj = build_dir / "obj" / (rel.replace("/", "__") + ".o")
        if path.suffix == ".cu":
            flags = [*cuda_flags, *includes, *(req.get("extra_cuda_cflags") or [])]
            post = tc["cuda_post_cflags"]
            cmd_head = tc["nvcc"]
        else:
            flags = [*tc["cflags"], *includes, *(req.get("extra_cflags") or [])]
            if pch_applies(text):
                flags += ["-include", tc["pch"], "-Winvalid-pch"]
            post = tc["post_cflags"]
            cmd_head = tc["cxx"]
        key = hashlib.sha256(json.dumps([tc["key"], cmd_head, flags, post, rel, text, headers]).encode()).hexdigest()
        obj = object_dir / f"{key[:32]}.o"
        cmd = None if obj.is_file() else [*cmd_head, *flags, "-c", str(path), "-o", str(tmp_obj), *post]
        plan.append((rel, obj, cmd))
    todo = [(rel, obj, cmd) for rel, obj, cmd in plan if cmd is not None]
    print(f"toolchain {tc['dir']} ({t_toolchain:.1f} s); {len(plan)} units, {len(todo)} to compile, "
          f"{len(plan) - len(todo)} from the object cache", flush=True)
    failed = _compile_all(todo)
    if failed:
        return {"ok": False, "error": f"BuildError: {failed[0][-1500:]}"}
    error = _link([str(obj) for _, obj, _ in plan], tc, req, build_dir)
    if error:
        return {"ok": False, "error": error}
    return {"ok": True, "compiled": [rel for rel, _, _ in todo], "toolchain_s": t_toolchain}


def lite_blocker(files: dict[str, str]) -> str | None:
    """Why a solution's files (``{relative path: text}``) cannot be built against the light headers
    (``templates/lite``), or None when they may be tried: a ``PYBIND11_MODULE`` of their own, or an
    ``#include`` of a torch / ATen / c10 / pybind11 header that the light set does not hold."""
    for rel, text in sorted(files.items()):
        if rel in FIXED_FILES:
            continue
        if "PYBIND11_MODULE" in text:
            return f"{rel} defines its own PYBIND11_MODULE"
        for name in _INCLUDE.findall(_COMMENTS.sub("", text)):
            if name.split("/")[0] in TORCH_HEADER_ROOTS and name not in LITE_HEADERS:
                return f"{rel} includes <{name}>"
    return None


def _lite_build(req: dict[str, Any], tc: dict, build_dir: Path, files: dict[str, str], object_dir: Path,
                includes: list[str], t_toolchain: float) -> dict[str, Any] | None:
    """Build against the light headers: every source of the solution (``files``: relative path under
    ``<build_dir>/src`` -> text; the fixed binding excepted) is compiled with ``templates/lite`` in place of
    torch's headers, from a copy of the sources whose ``kernels/registry.h`` includes them, and linked with the
    toolchain's ``lite_binding.o``. Returns the build's result, or None when a source does not compile so (the
    caller builds with the full headers)."""
    src_dir, lite_src = build_dir / "src", build_dir / "lite_src"
    lite_files = {rel: LITE_REGISTRY if rel == "kernels/registry.h" else text for rel, text in files.items()}
    for rel, text in lite_files.items():
        (lite_src / rel).parent.mkdir(parents=True, exist_ok=True)
        (lite_src / rel).write_text(text)
    headers = sorted((rel, text) for rel, text in lite_files.items() if rel.endswith(HEADER_SUFFIXES))
    lite_inc = ["-I" + tc["lite_include"], *tc["lite_defines"]]
    plan: list[tuple[str, Path, list[str] | None]] = []
    for path in map(Path, req["sources"]):
        rel = path.relative_to(src_dir).as_posix()
        if rel == "kernels/binding.cpp":
            continue
        text = lite_files[rel]
        tmp_obj = build_dir / "obj" / ("lite__" + rel.replace("/", "__") + ".o")
        if path.suffix == ".cu":
            flags = [*_sass_only(tc["lite_cuda_cflags"]), *lite_inc, *includes, *(req.get("extra_cuda_cflags") or [])]
            post, cmd_head = tc["cuda_post_cflags"], tc["nvcc"]
        else:
            flags = [*tc["lite_cflags"], *lite_inc, *includes, *(req.get("extra_cflags") or [])]
            post, cmd_head = tc["post_cflags"], tc["cxx"]
        key = hashlib.sha256(json.dumps(["lite", tc["key"], cmd_head, flags, post, rel, text, headers]).encode()).hexdigest()
        obj = object_dir / f"{key[:32]}.o"
        cmd = None if obj.is_file() else [*cmd_head, *flags, "-c", str(lite_src / rel), "-o", str(tmp_obj), *post]
        plan.append((rel, obj, cmd))
    todo = [(rel, obj, cmd) for rel, obj, cmd in plan if cmd is not None]
    print(f"toolchain {tc['dir']} ({t_toolchain:.1f} s); light headers: {len(plan)} units, {len(todo)} to compile, "
          f"{len(plan) - len(todo)} from the object cache", flush=True)
    if _compile_all(todo):
        print("light headers: a source needs more of torch than they hold; full torch headers", flush=True)
        return None
    if _link([*[str(obj) for _, obj, _ in plan], tc["lite_binding_obj"]], tc, req, build_dir):
        print("light headers: the link failed; full torch headers", flush=True)
        return None
    return {"ok": True, "compiled": [rel for rel, _, _ in todo], "toolchain_s": t_toolchain, "headers": "lite"}


def _compile_all(todo: list[tuple[str, Path, list[str]]]) -> list[str]:
    """Compile ``todo`` ((relative path, cached object path, command)) side by side; each object is
    published under its cache path. Returns [] when all compiled, else the failures' messages; the
    commands and the compilers' output go to the log."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda item: _run(item[2]), todo))
    failed = []
    for (rel, obj, cmd), (code, output, seconds) in zip(todo, results, strict=True):
        print(f"$ {shlex.join(cmd)}\n{output}[{rel}: {seconds:.1f} s, exit {code}]", flush=True)
        if code:
            failed.append(f"compiling {rel} failed (exit {code}):\n{output[-1500:]}")
            continue
        tmp = obj.with_name(f"{obj.name}.{os.getpid()}.tmp")
        os.replace(Path(cmd[cmd.index("-o") + 1]), tmp)
        os.replace(tmp, obj)  # published whole: a concurrent build sees the old object or the new one
    return failed


def _link(objects: list[str], tc: dict, req: dict[str, Any], build_dir: Path) -> str | None:
    """Link ``objects`` into ``<build_dir>/<name>.so``; None when it worked, else the error."""
    link_tmp = build_dir / "link.tmp"
    cmd = [*tc["cxx"], *objects, *tc["ldflags"], *(req.get("extra_ldflags") or []), "-o", str(link_tmp)]
    code, output, seconds = _run(cmd)
    print(f"$ {shlex.join(cmd)}\n{output}[link: {seconds:.1f} s, exit {code}]", flush=True)
    if code:
        return f"BuildError: linking failed (exit {code}):\n{output[-1500:]}"
    os.replace(link_tmp, build_dir / f"{req['name']}.so")
    return None


def main() -> None:
    step, req_path, res_path = sys.argv[1:4]
    with open(req_path) as fh:
        req = json.load(fh)
    try:
        if step != "build":
            raise ValueError(f"unknown step {step!r} (only 'build')")
        res = build(req)
    except Exception as exc:  # noqa: BLE001 - a failure of the step itself, reported as such
        traceback.print_exc()
        res = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    with open(res_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
