// Linear layer on cuBLASLt (the GEMM library route allowed by the rules): D = A @ W^T + bias (+ C), row-major.
// One handle per device, created once; the stream is the caller's; the heuristic's algorithm is cached per
// (sizes, dtype, alignment). Workspace comes from the caching allocator on the call's stream.
#pragma once
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <map>
#include <mutex>
#include <tuple>

#define LT_CHECK(expr)                                                                                       \
    do {                                                                                                     \
        cublasStatus_t s_ = (expr);                                                                          \
        TORCH_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call failed: ", #expr, " status ", (int)s_);     \
    } while (0)

namespace ltlin {

inline cublasLtHandle_t handle() {
    static std::mutex mu;
    static cublasLtHandle_t handles[64] = {};
    int dev = 0;
    cudaGetDevice(&dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!handles[dev]) LT_CHECK(cublasLtCreate(&handles[dev]));
    return handles[dev];
}

inline int align_of(const void* p) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    int al = 256;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
}

// A [M, K], W [N, K], bias [N] (or nullptr), C [M, N] (or nullptr), D [M, N]: all row-major, one dtype dt.
// compute: CUBLAS_COMPUTE_32F (float32 accumulate).
inline void linear(const void* A, const void* W, const void* bias, const void* C, void* D, int64_t M, int64_t N, int64_t K,
                   cudaDataType_t dt, cudaStream_t stream, const torch::TensorOptions& opts) {
    if (M == 0 || N == 0) return;
    cublasLtHandle_t h = handle();
    // column-major view: D^T [N, M] = (W) [N, K] x A^T [K, M]; W row-major [N, K] is col-major [K, N] -> op T.
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, dt, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, dt, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, dt, N, M, N));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, N, M, N));
    const size_t ws_bytes = 32u << 20;
    auto ws = torch::empty({(int64_t)ws_bytes}, opts.dtype(torch::kUInt8));
    const int al = std::min({align_of(A), align_of(W), align_of(D), C ? align_of(C) : 256, bias ? align_of(bias) : 256});
    using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int>;
    static std::mutex mu;
    static std::map<Key, cublasLtMatmulAlgo_t> cache;
    int dev = 0;
    cudaGetDevice(&dev);
    Key key{M, N, K, (int)dt, al, bias != nullptr, dev};
    cublasLtMatmulAlgo_t algo;
    bool have = false;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = cache.find(key);
        if (it != cache.end()) { algo = it->second; have = true; }
    }
    if (!have) {
        cublasLtMatmulPreference_t pref;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
        uint32_t a32 = (uint32_t)al;
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof(a32)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a32, sizeof(a32)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a32, sizeof(a32)));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a32, sizeof(a32)));
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, 1, &res, &n));
        cublasLtMatmulPreferenceDestroy(pref);
        TORCH_CHECK(n > 0, "cuBLASLt: no algorithm for this linear layer");
        algo = res.algo;
        std::lock_guard<std::mutex> lock(mu);
        cache[key] = algo;
    }
    const float alpha = 1.f, beta = C ? 1.f : 0.f;
    LT_CHECK(cublasLtMatmul(h, op, &alpha, W, la, A, lb, &beta, C ? C : D, lc, D, ld, &algo, ws.data_ptr(), ws_bytes, stream));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

}  // namespace ltlin
