// Shared helpers of this solution: one cuBLASLt / cuDNN handle per device (created once, stream set per call),
// a cuBLASLt matmul wrapper (column-major, strided batch, bias / ReLU / GELU epilogues, C input) and the
// fp16 / bf16 <-> float conversions used by the kernels.
#pragma once
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <map>
#include <tuple>

#define LT_CHECK(expr)                                                                                  \
    do {                                                                                                \
        cublasStatus_t st_ = (expr);                                                                    \
        TORCH_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call failed (", (int)st_, "): " #expr);    \
    } while (0)

static inline cublasLtHandle_t lt_handle() {
    static cublasLtHandle_t handles[64] = {};
    int dev = 0;
    cudaGetDevice(&dev);
    if (!handles[dev]) LT_CHECK(cublasLtCreate(&handles[dev]));
    return handles[dev];
}

template <typename T> struct CudaType;
template <> struct CudaType<float> { static constexpr cudaDataType_t v = CUDA_R_32F; };
template <> struct CudaType<__half> { static constexpr cudaDataType_t v = CUDA_R_16F; };
template <> struct CudaType<__nv_bfloat16> { static constexpr cudaDataType_t v = CUDA_R_16BF; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// One matmul in cuBLAS's column-major convention:
//   D[m, n] (+ batch stride) = alpha * op(A)[m, k] * op(B)[k, n] + beta * C[m, n] (+ bias[m], then act)
// A, B in ab_type, C and D in cd_type, bias (length m) in cd_type. C may be null (beta = 0).
struct LtArgs {
    cudaDataType_t ab_type, cd_type;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    bool transa = false, transb = false;
    int64_t m = 0, n = 0, k = 0;
    const void* A = nullptr; int64_t lda = 0, strideA = 0;
    const void* B = nullptr; int64_t ldb = 0, strideB = 0;
    const void* C = nullptr; int64_t ldc = 0, strideC = 0;
    void* D = nullptr; int64_t ldd = 0, strideD = 0;
    int batch = 1;
    float alpha = 1.f, beta = 0.f;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
};

static inline void lt_matmul(const LtArgs& a, const torch::Device& device, cudaStream_t stream) {
    cublasLtHandle_t h = lt_handle();
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, a.compute, CUDA_R_32F));
    cublasOperation_t ta = a.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = a.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (a.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &a.epilogue, sizeof(a.epilogue)));
        if (a.bias) LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a.bias, sizeof(a.bias)));
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, a.ab_type, a.transa ? a.k : a.m, a.transa ? a.m : a.k, a.lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, a.ab_type, a.transb ? a.n : a.k, a.transb ? a.k : a.n, a.ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, a.cd_type, a.m, a.n, a.C ? a.ldc : a.ldd));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld, a.cd_type, a.m, a.n, a.ldd));
    if (a.batch > 1) {
        int32_t b = a.batch;
        int64_t sc = a.C ? a.strideC : a.strideD;
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &a.strideA, sizeof(int64_t)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &a.strideB, sizeof(int64_t)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof(int64_t)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &a.strideD, sizeof(int64_t)));
    }
    const size_t ws_size = 32u << 20;
    auto ws = torch::empty({(int64_t)ws_size}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof(ws_size)));
    cublasLtMatmulHeuristicResult_t res[1];
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, a.C ? lc : ld, ld, pref, 1, res, &found));
    TORCH_CHECK(found > 0, "cuBLASLt found no algorithm for this matmul");
    LT_CHECK(cublasLtMatmul(h, op, &a.alpha, a.A, la, a.B, lb, &a.beta, a.C ? a.C : a.D, a.C ? lc : ld, a.D, ld,
                            &res[0].algo, ws.data_ptr(), ws_size, stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}
