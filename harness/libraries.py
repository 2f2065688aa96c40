"""The library policy of candidate kernels, and how to build and load a solution that uses an allowed library.

Policy (issue #57, after CUDA-Agent's rules, arXiv 2602.24286: cuBLAS for GEMM only, cuDNN for convolution only):

* **cuBLAS** (``cublas*``): the GEMM family (every routine whose name holds ``gemm``: ``cublasSgemm_v2``,
  ``cublasGemmEx``, ``cublasGemmStridedBatchedEx``, grouped and 64-bit variants) and the management of a handle
  (create / destroy, stream, workspace, math / pointer / atomics mode, version, status strings). Every other
  routine (``axpy``, ``scal``, ``geam``, ``dgmm``, ``gemv``, ``dot``, ``trsm``, ``syrk``...) and ``cublasXt``
  (host-memory multi-GPU) is denied.
* **cuBLASLt** (``cublasLt*``): matmul with its epilogues (bias, ReLU / GELU, aux outputs) and its
  descriptors, layouts, preferences, heuristics, algorithms, logger; ``cublasLtMatrixTransform*`` (a
  non-GEMM elementwise transform) is denied.
* **cuDNN** (``cudnn*``): convolution forward (``cudnnConvolutionForward``, fused
  ``cudnnConvolutionBiasActivationForward``, algorithm search, workspace sizes), backward data (the
  transposed convolution of ``ConvTranspose``), the fused-ops API, the tensor / filter / convolution /
  activation descriptors and a handle; the backend (graph) API when the graph holds a convolution forward
  operation and no operation of ``DENIED_CUDNN_GRAPH_OPS`` (normalization, softmax, attention, matmul...).
  Every other cuDNN routine (``cudnnSoftmaxForward``, ``cudnnBatchNormalizationForwardInference``,
  ``cudnnAddTensor``, ``cudnnPoolingForward``...) is denied.
* **Nothing else from a library**: cuFFT, cuSPARSE, cuSOLVER, cuRAND (host and device API), NCCL, cuTENSOR,
  NPP, nvJPEG, NVRTC, nvJitLink, CUPTI, Thrust and CUB's device-wide algorithms (``cub::Device*``); and no ATen /
  torch compute route (``harness.symbols``), torch's own library handles included
  (``at::cuda::getCurrentCUDABlasHandle``). CUB's block / warp primitives compile into your own kernel and pass.

``harness.symbols`` enforces this on the sources (identifiers and includes) and on the symbols the built
extension imports. ``link_flags(sources)`` gives what the build needs for the allowed libraries a solution
uses: include dirs, library dirs, ``-l`` flags and an rpath, found in the installed NVIDIA wheels
(``site-packages/nvidia/cu13``, ``nvidia/cublas``, ``nvidia/cudnn``), ``$CUDA_HOME`` and ``/usr/local/cuda``.
"""

from __future__ import annotations

import os
import re
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

# library -> (shared object name stem, header that declares it)
ALLOWED_LIBRARIES = {"cublas": ("libcublas.so", "cublas_v2.h"), "cublasLt": ("libcublasLt.so", "cublasLt.h"),
                     "cudnn": ("libcudnn.so", "cudnn.h")}
_MANAGE = r"(Create|Destroy|SetStream|GetStream|SetWorkspace|GetVersion|GetProperty|GetCudartVersion|" \
          r"GetStatusName|GetStatusString|SetMathMode|GetMathMode|SetPointerMode|GetPointerMode|SetAtomicsMode|" \
          r"GetAtomicsMode|SetSmCountTarget|GetSmCountTarget|LoggerConfigure|SetLoggerCallback|GetLoggerCallback)"
ALLOWED_CALLS = {
    # the GEMM family and the handle's management
    "cublas": re.compile(rf"^cublas(?!Xt|Lt)({_MANAGE}(_v2)?|\w*gemm\w*|\w*Gemm\w*)$"),
    # matmul (with its epilogues) and everything it is configured with; not MatrixTransform
    "cublasLt": re.compile(r"^cublasLt(?!MatrixTransform)\w+$"),
    # convolution forward / backward data, fused ops, their descriptors, the handle, the backend (graph) API
    "cudnn": re.compile(
        r"^cudnn(Create|Destroy|SetStream|GetStream|GetVersion|GetCudartVersion|GetProperty|GetErrorString|"
        r"GetLastErrorString|QueryRuntimeError|SetCallback|GetCallback|GetMaxDeviceVersion|"
        r"(Cnn|Ops|Graph|Adv)VersionCheck|GetTensorSizeInBytes|GetFilterSizeInBytes|"
        r"(Create|Destroy|Set|Get)(Tensor|Tensor4d|TensorNd|Filter|Filter4d|FilterNd|Convolution|Convolution2d|"
        r"ConvolutionNd|Activation)Descriptor(Ex)?|(Set|Get)ActivationDescriptorSwishBeta|"
        r"(Set|Get)Convolution(MathType|GroupCount|ReorderType)|GetConvolution(2d|Nd)ForwardOutputDim|"
        r"(Get|Find)Convolution(Forward|BackwardData)Algorithm(_v7|MaxCount|Ex)?|"
        r"GetConvolution(Forward|BackwardData)WorkspaceSize|ConvolutionForward|ConvolutionBiasActivationForward|"
        r"ConvolutionBackwardData|GetFoldedConvBackwardDataDescriptors|"
        r"(Create|Destroy|Set|Get|Make)FusedOps\w*|FusedOpsExecute|GetExecutionPlanWorkspaceSize|"
        r"Backend(CreateDescriptor|DestroyDescriptor|Initialize|Finalize|SetAttribute|GetAttribute|Execute|"
        r"PopulateCudaGraph|UpdateCudaGraph))$"),
}
# operations a cuDNN graph may not hold (not part of a convolution or its epilogue)
DENIED_CUDNN_GRAPH_OPS = ("MATMUL", "MOE_", "NORM_", "BN_", "SDPA_", "SOFTMAX", "ROPE_", "RESAMPLE_", "RNG",
                          "SIGNAL", "PAGED_CACHE", "CONTRACT_BAND", "EXPAND_BAND", "DIAGONAL_BAND", "BLOCK_SCALE",
                          "CONVOLUTION_BACKWARD_FILTER", "GEN_STATS", "CONCAT")
CUDNN_GRAPH_CONV = "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR"
# identifiers (symbols and source tokens) of libraries a solution may not use at all
DENIED_LIBRARY = re.compile(r"^(cufft|cusparse|cusolver|curand|nccl|cutensor|npp[a-z]*[A-Z]|nvjpeg|nvrtc|"
                            r"nvJitLink|nvjitlink|cupti|cublasXt|nvblas)")
DENIED_INCLUDE = re.compile(r"#\s*include\s*[<\"]\s*(cufft|cusparse|cusolver|curand|nccl|cutensor|npp|nvjpeg|"
                            r"nvrtc|nvJitLink|cupti|cublasXt|nvblas|thrust/)")
DENIED_SOURCE_TOKENS = ("thrust::", "cub::Device", "getCurrentCUDABlas", "getCudnnHandle", "getCUDABlasLt")
_IDENT = re.compile(r"\b(cublasLt|cublas|cudnn)[A-Za-z0-9_]+")
_ALL_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*")


def _code(text: str) -> str:
    """``text`` without comments and ``#include`` lines (their header names are checked apart)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r"^\s*#\s*include[^\n]*", " ", text, flags=re.M)


class LibraryError(RuntimeError):
    """An allowed library a solution uses is not installed where the build looks; the message names it and
    the places searched."""


def library_of(name: str) -> str | None:
    """The allowed library a C identifier or imported symbol belongs to (``cublas``, ``cublasLt``,
    ``cudnn``), or None. ``cublasXt*`` belongs to none (denied)."""
    name = name.split("@")[0]
    if name.startswith("cublasLt"):
        return "cublasLt"
    if name.startswith("cublasXt"):
        return None
    if name.startswith("cublas"):
        return "cublas"
    if name.startswith("cudnn"):
        return "cudnn"
    return None


def call_allowed(name: str) -> bool | None:
    """Whether the library function ``name`` (an imported symbol, version suffix ``@...`` ignored) is allowed:
    True / False for a function of cuBLAS / cuBLASLt / cuDNN, False for any other library of the policy,
    None for a name of no library (the ATen / system rules of ``harness.symbols`` apply to it)."""
    name = name.split("@")[0]
    if DENIED_LIBRARY.match(name):
        return False
    lib = library_of(name)
    if lib is None:
        return None
    return bool(ALLOWED_CALLS[lib].match(name))


def source_violations(text: str) -> list[str]:
    """Library-policy tokens of one source text: a denied library's identifier or include, a cuBLAS / cuDNN
    function outside the GEMM / convolution families (type names ending ``_t`` and ``CUBLAS_`` / ``CUDNN_``
    constants pass), a cuDNN graph without a convolution or with a denied operation. Each once, in order."""
    bad: list[str] = []

    def add(tok: str) -> None:
        if tok not in bad:
            bad.append(tok)

    for m in DENIED_INCLUDE.finditer(text):
        add(f"#include {m.group(1)}")
    for tok in DENIED_SOURCE_TOKENS:
        if tok in text:
            add(tok)
    # denied libraries: on the text with comments (a header-only device API has no imported symbol to audit)
    for m in _ALL_IDENT.finditer(re.sub(r"^\s*#\s*include[^\n]*", " ", text, flags=re.M)):
        if DENIED_LIBRARY.match(m.group(0)):
            add(m.group(0))
    # cuBLAS / cuDNN outside the families: on the code (every call is also an imported symbol, audited too)
    for m in _IDENT.finditer(_code(text)):
        ident = m.group(0)
        if not ident.endswith("_t") and ident != "cublasLt" and call_allowed(ident) is False:
            add(ident)
    if "cudnnBackend" in text:
        for m in re.finditer(r"CUDNN_BACKEND_OPERATION_\w+", text):
            if m.group(0).removeprefix("CUDNN_BACKEND_OPERATION_").startswith(DENIED_CUDNN_GRAPH_OPS):
                add(m.group(0))
        if "cudnnBackendExecute" in text and CUDNN_GRAPH_CONV not in text:
            add("cudnnBackendExecute without a convolution forward operation")
    return bad


def libraries_used(sources: dict[str, str]) -> list[str]:
    """The allowed libraries (``ALLOWED_LIBRARIES`` keys, in that order) the sources call or include."""
    text = "\n".join(sources.values())
    used = {library_of(m.group(0)) for m in _IDENT.finditer(text)}
    for lib, (_so, header) in ALLOWED_LIBRARIES.items():
        if re.search(rf"#\s*include\s*[<\"]{re.escape(header)}", text):
            used.add(lib)
    if "cublas_api.h" in text or "cublas_v2.h" in text:
        used.add("cublas")
    return [lib for lib in ALLOWED_LIBRARIES if lib in used]


@dataclass
class LinkFlags:
    """What a build needs for the libraries ``libraries``: ``include_dirs`` (``-I``), ``library_dirs``
    (``-L``), ``libraries`` (the names), ``ldflags`` (``-L`` / ``-l:libX.so.N`` / ``-Wl,-rpath,``) and
    ``rpath`` (the directories the loader searches at import)."""

    libraries: list[str] = field(default_factory=list)
    include_dirs: list[str] = field(default_factory=list)
    library_dirs: list[str] = field(default_factory=list)
    ldflags: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)


def search_roots() -> list[Path]:
    """Where the libraries are looked for, in order: ``$OPFORGE_CUDA_LIBS`` (``os.pathsep``-separated
    roots), each site-packages' ``nvidia/cu13``, ``nvidia/cu12``, ``nvidia/cublas``, ``nvidia/cudnn``, then
    ``$CUDA_HOME`` / ``$CUDA_PATH`` and ``/usr/local/cuda``. A root holds ``include/`` and ``lib/`` or
    ``lib64/``."""
    roots: list[Path] = [Path(p) for p in os.environ.get("OPFORGE_CUDA_LIBS", "").split(os.pathsep) if p]
    sites = [*site.getsitepackages(), site.getusersitepackages(), *[p for p in sys.path if p.endswith("-packages")]]
    for sp in dict.fromkeys(sites):
        for sub in ("cu13", "cu12", "cublas", "cudnn"):
            roots.append(Path(sp) / "nvidia" / sub)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.append(Path(os.environ[env]))
    roots.append(Path("/usr/local/cuda"))
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def _find(lib: str, roots: list[Path]) -> tuple[Path, Path, str]:
    so, header = ALLOWED_LIBRARIES[lib]
    for root in roots:
        inc = root / "include"
        if not (inc / header).is_file():
            continue
        for libdir in (root / "lib", root / "lib64", root / "targets" / "x86_64-linux" / "lib"):
            found = sorted(libdir.glob(f"{so}*")) if libdir.is_dir() else []
            if found:
                exact = libdir / so
                name = so if exact.exists() else min((f.name for f in found), key=len)
                return inc, libdir, name
    raise LibraryError(f"{lib}: the solution uses it but no {so}* with include/{header} was found under "
                       f"{', '.join(map(str, roots)) or 'no existing root'} (install nvidia-cublas / nvidia-cudnn-cu13 "
                       "or set CUDA_HOME / OPFORGE_CUDA_LIBS)")


def link_flags(sources: dict[str, str], roots: list[Path] | None = None) -> LinkFlags:
    """Include dirs, library dirs, ``-l`` flags and rpath for the allowed libraries ``sources`` use (none:
    empty ``LinkFlags``). A library without its unversioned ``.so`` (the pip wheels ship ``libcublas.so.13``)
    is linked by file name (``-l:libcublas.so.13``).

    Raises:
        LibraryError: a library the sources use is not found (the message names it and the roots searched).
    """
    used = libraries_used(sources)
    out = LinkFlags(libraries=used)
    if not used:
        return out
    roots = search_roots() if roots is None else roots
    for lib in used:
        inc, libdir, name = _find(lib, roots)
        if str(inc) not in out.include_dirs:
            out.include_dirs.append(str(inc))
        if str(libdir) not in out.library_dirs:
            out.library_dirs.append(str(libdir))
            out.rpath.append(str(libdir))
            out.ldflags += [f"-L{libdir}", f"-Wl,-rpath,{libdir}"]
        stem = name.removeprefix("lib").removesuffix(".so")
        out.ldflags.append(f"-l{stem}" if name.endswith(".so") else f"-l:{name}")
    return out


def build_options(sources: dict[str, str], roots: list[Path] | None = None) -> dict[str, list[str]]:
    """``torch.utils.cpp_extension.load`` keyword arguments for the allowed libraries ``sources`` use:
    ``{"extra_include_paths": [...], "extra_ldflags": [...]}`` (both empty when none is used). Raises
    ``LibraryError`` as ``link_flags``."""
    flags = link_flags(sources, roots)
    return {"extra_include_paths": flags.include_dirs, "extra_ldflags": flags.ldflags}
