"""The library policy (harness/libraries.py, issue #57) on CPU: cuBLAS / cuBLASLt for GEMM and cuDNN for
convolution pass the source and symbol audits, every other library call is a hack; the build finds the allowed
libraries; a solution that breaks the policy is ``hacked`` before anything is built."""

from pathlib import Path

import pytest
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.libraries import LibraryError, build_options, call_allowed, libraries_used, link_flags
from opforge.harness.solution import Solution
from opforge.harness.symbols import denied_symbols, denied_tokens

from .redteam.library_cases import ALLOWED_SYMBOLS, DENIED_SYMBOLS, LIBRARY_HACKS, LIBRARY_HONEST


@pytest.mark.parametrize("name", sorted(LIBRARY_HONEST))
def test_gemm_by_cublas_and_convolution_by_cudnn_pass_the_source_audit(name):
    files = LIBRARY_HONEST[name]
    assert denied_tokens({k: v for k, v in files.items() if k.startswith("kernels/")}) == []


@pytest.mark.parametrize("name", sorted(LIBRARY_HACKS))
def test_other_library_calls_are_denied_in_the_sources(name):
    files, token = LIBRARY_HACKS[name]
    bad = denied_tokens({k: v for k, v in files.items() if k.startswith("kernels/")})
    assert any(b.endswith(f":{token}") for b in bad), bad


def test_symbol_audit_allows_exactly_the_gemm_and_convolution_families():
    assert denied_symbols(ALLOWED_SYMBOLS) == []
    denied = denied_symbols(DENIED_SYMBOLS)
    assert denied == [s.split("(")[0] for s in DENIED_SYMBOLS], denied


@pytest.mark.parametrize("name,allowed", [
    ("cublasSgemm_v2", True), ("cublasHgemmStridedBatched", True), ("cublasGemmGroupedBatchedEx", True),
    ("cublasSgemm_v2_64", True), ("cublasSetWorkspace_v2", True), ("cublasLtMatmulAlgoGetHeuristic", True),
    ("cudnnConvolutionBackwardData", True), ("cudnnSetConvolutionNdDescriptor", True),
    ("cudnnBackendFinalize", True), ("cudnnFusedOpsExecute", True),
    ("cublasSaxpy_v2", False), ("cublasSscal_v2", False), ("cublasSgeam", False), ("cublasSgemv_v2", False),
    ("cublasSsyrk_v2", False), ("cublasLtMatrixTransform", False), ("cudnnPoolingForward", False),
    ("cudnnConvolutionBackwardFilter", False), ("cudnnOpTensor", False), ("curand_uniform", False),
    ("ncclCommInitRank", False), ("cudaLaunchKernel", None), ("memcpy", None),
])
def test_call_allowed_table(name, allowed):
    assert call_allowed(name) is allowed


def test_cudnn_graph_must_hold_a_convolution_and_no_other_denied_operation():
    conv = ("cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op);\n"
            "cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &pw);\n"
            "cudnnBackendExecute(h, plan, pack);\n")
    assert denied_tokens({"kernels/g.cu": conv}) == []
    norm = conv.replace("CONVOLUTION_FORWARD", "NORM_FORWARD")
    bad = denied_tokens({"kernels/g.cu": norm})
    assert "kernels/g.cu:CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR" in bad
    assert "kernels/g.cu:cudnnBackendExecute without a convolution forward operation" in bad
    assert denied_tokens({"kernels/g.cu": conv + "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR"}) != []


def test_comments_and_types_do_not_count_as_calls():
    text = ("// not cublasSaxpy: a GEMM\n/* cudnnSoftmaxForward would be denied */\n"
            "cublasHandle_t h; cudnnTensorDescriptor_t d; int m = CUBLAS_OP_N;\n")
    assert denied_tokens({"kernels/a.cu": text}) == []
    # a denied library is denied in a comment too (its device API is header-only: nothing else to audit)
    assert denied_tokens({"kernels/a.cu": "// curand_init(0, 0, 0, &s);\n"}) == ["kernels/a.cu:curand_init"]


def test_libraries_used_and_link_flags(tmp_path):
    assert libraries_used({"a.cu": "__global__ void k() {}"}) == []
    assert libraries_used({"a.cu": "#include <cudnn.h>\n", "b.cu": "cublasLtMatmul(h);"}) == ["cublasLt", "cudnn"]
    root = tmp_path / "nvidia" / "cu13"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "cublas_v2.h").write_text("")
    (root / "lib" / "libcublas.so.13").write_text("")
    flags = link_flags({"a.cu": "cublasGemmEx(h);"}, roots=[root])
    assert flags.libraries == ["cublas"] and flags.include_dirs == [str(root / "include")]
    assert flags.ldflags == [f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}", "-l:libcublas.so.13"]
    (root / "lib" / "libcublas.so").write_text("")
    assert build_options({"a.cu": "cublasGemmEx(h);"}, roots=[root])["extra_ldflags"][-1] == "-lcublas"
    assert build_options({"a.cu": "int x;"}, roots=[]) == {"extra_include_paths": [], "extra_ldflags": []}
    with pytest.raises(LibraryError, match=r"cudnn: .*libcudnn\.so"):
        link_flags({"a.cu": "cudnnCreate(&h);"}, roots=[root])


@pytest.mark.parametrize("name", ["cublas_dgmm", "cusparse_handle"])
def test_library_hack_is_hacked_before_the_build(name, tmp_path):
    """Without CUDA headers (CPU CI) the build would fail: the source audit runs first, so the verdict is
    ``hacked`` and nothing is built."""
    files, token = LIBRARY_HACKS[name]
    row = {"task_id": "scale_relu", "code": Path(__file__).with_name("harness_cases.py").read_text().split("'''")[1]}
    res = evaluate(row, Solution(files), EvalConfig(profile_compile=False), build_root=tmp_path / "ext")
    assert res.status == "hacked" and res.reward == -1.0, (res.status, res.error)
    assert any(h.startswith("source:") and h.endswith(token) for h in res.hacks), res.hacks
    assert res.build_s == 0.0 and not (tmp_path / "ext").exists()
