// Shared helpers of this solution: 16-byte vector loads / stores converted to float32 registers, warp sums,
// and a cuBLASLt call for row-major linear layers (GEMM only, as the library policy of issue #57 allows).
#pragma once
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <map>
#include <mutex>
#include <tuple>

namespace gold {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// round through the storage dtype (what the reference does when it materialises an intermediate)
template <typename T> __device__ __forceinline__ float rnd(float v) { return to_f(from_f<T>(v)); }

template <int BYTES> struct Bits;
template <> struct Bits<16> { using type = uint4; };
template <> struct Bits<8> { using type = uint2; };
template <> struct Bits<4> { using type = unsigned int; };
template <> struct Bits<2> { using type = unsigned short; };

// VEC consecutive elements at p (aligned to VEC * sizeof(T)) into float registers
template <typename T, int VEC>
__device__ __forceinline__ void ldv(const T* p, float (&f)[VEC]) {
    using V = typename Bits<VEC * sizeof(T)>::type;
    V v = __ldg(reinterpret_cast<const V*>(p));
    const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = to_f(t[i]);
}
// streaming load (read once: evict-first)
template <typename T, int VEC>
__device__ __forceinline__ void ldv_cs(const T* p, float (&f)[VEC]) {
    using V = typename Bits<VEC * sizeof(T)>::type;
    V v = __ldcs(reinterpret_cast<const V*>(p));
    const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = to_f(t[i]);
}
template <typename T, int VEC>
__device__ __forceinline__ void stv(T* p, const float (&f)[VEC]) {
    using V = typename Bits<VEC * sizeof(T)>::type;
    V v;
    T* t = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) t[i] = from_f<T>(f[i]);
    *reinterpret_cast<V*>(p) = v;
}

template <int WIDTH = 32>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> inline cudaDataType_t cuda_type();
template <> inline cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> inline cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> inline cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

inline cudaDataType_t cuda_type_of(const torch::Tensor& t) {
    switch (t.scalar_type()) {
        case torch::kFloat: return CUDA_R_32F;
        case torch::kHalf: return CUDA_R_16F;
        case torch::kBFloat16: return CUDA_R_16BF;
        default: TORCH_CHECK(false, "gold: unsupported dtype ", t.scalar_type());
    }
    return CUDA_R_32F;
}

#define GOLD_LT(call)                                                                             \
    do {                                                                                          \
        cublasStatus_t st_ = (call);                                                              \
        TORCH_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call failed (status ", (int)st_, "): ", #call); \
    } while (0)

inline cublasLtHandle_t lt_handle() {
    static cublasLtHandle_t handles[64] = {};
    static std::mutex mu;
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    if (!handles[dev]) GOLD_LT(cublasLtCreate(&handles[dev]));
    return handles[dev];
}

struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
};

constexpr size_t kLtWorkspace = 32u << 20;

// D[M,N] = epilogue(A[M,K] @ W[N,K]^T + beta * C[M,N] + bias[N]), all row-major and contiguous, float32
// accumulation (CUBLAS_COMPUTE_32F: no TF32 for float32 data). C may be null (beta ignored). bias may be null
// when the epilogue has no bias. epi: CUBLASLT_EPILOGUE_DEFAULT / _BIAS / _RELU_BIAS / _GELU_BIAS.
// Returns false (and launches nothing) when cuBLASLt has no algorithm for this problem and epilogue.
inline bool lt_linear_try(const void* A, const void* W, const void* bias, const void* C, void* D, int64_t M, int64_t N,
                          int64_t K, cudaDataType_t dt, cublasLtEpilogue_t epi, float beta, const torch::Device& device,
                          cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    int dev = device.index();
    using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, bool, int>;
    static std::map<Key, LtPlan> plans;
    static std::mutex mu;
    cublasLtHandle_t h = lt_handle();
    Key key{dev, M, N, K, (int)dt, (int)epi, C != nullptr, (int)compute};
    LtPlan* plan;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = plans.find(key);
        if (it == plans.end()) {
            LtPlan p;
            GOLD_LT(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            GOLD_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
            GOLD_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
            GOLD_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
            if (bias) GOLD_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
            // column-major view: D^T (N x M) = W (K x N)^T * A^T (K x M)
            GOLD_LT(cublasLtMatrixLayoutCreate(&p.a, dt, K, N, K));
            GOLD_LT(cublasLtMatrixLayoutCreate(&p.b, dt, K, M, K));
            GOLD_LT(cublasLtMatrixLayoutCreate(&p.c, dt, N, M, N));
            GOLD_LT(cublasLtMatrixLayoutCreate(&p.d, dt, N, M, N));
            cublasLtMatmulPreference_t pref;
            GOLD_LT(cublasLtMatmulPreferenceCreate(&pref));
            size_t ws = kLtWorkspace;
            GOLD_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
            cublasLtMatmulHeuristicResult_t res[1];
            int found = 0;
            GOLD_LT(cublasLtMatmulAlgoGetHeuristic(h, p.op, p.a, p.b, p.c, p.d, pref, 1, res, &found));
            cublasLtMatmulPreferenceDestroy(pref);
            if (found > 0) {
                p.algo = res[0].algo;
                p.ws = res[0].workspaceSize;
            } else {
                p.ws = SIZE_MAX;  // remembered: no algorithm
            }
            it = plans.emplace(key, p).first;
        }
        plan = &it->second;
    }
    if (plan->ws == SIZE_MAX) return false;
    if (bias) GOLD_LT(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    auto ws = torch::empty({(int64_t)std::max<size_t>(plan->ws, 1)}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
    const float alpha = 1.f;
    const float b = C ? beta : 0.f;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    GOLD_LT(cublasLtMatmul(h, plan->op, &alpha, W, plan->a, A, plan->b, &b, C ? C : D, plan->c, D, plan->d,
                           &plan->algo, ws.data_ptr(), plan->ws, stream));
    return true;
}

inline void lt_linear(const void* A, const void* W, const void* bias, const void* C, void* D, int64_t M, int64_t N,
                      int64_t K, cudaDataType_t dt, cublasLtEpilogue_t epi, float beta, const torch::Device& device) {
    TORCH_CHECK(lt_linear_try(A, W, bias, C, D, M, N, K, dt, epi, beta, device),
                "cuBLASLt: no algorithm for M=", M, " N=", N, " K=", K, " epilogue ", (int)epi);
}

}  // namespace gold

namespace gold {
// LayerNorm statistics of one row held by one warp in registers: chunk q = lane + 32 * j holds elements
// q * VEC .. q * VEC + VEC - 1 and is valid when q * VEC < C. Two passes over the registers (mean, then the
// centred sum of squares), as torch's LayerNorm kernels do in float32.
template <int VEC, int NJ>
__device__ __forceinline__ void warp_ln_stats(const float (&v)[NJ][VEC], int lane, int C, float eps, float& mean,
                                              float& rstd) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        if ((lane + 32 * j) * VEC < C)
#pragma unroll
            for (int i = 0; i < VEC; ++i) s += v[j][i];
    mean = warp_sum(s) / C;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        if ((lane + 32 * j) * VEC < C)
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                const float d = v[j][i] - mean;
                q += d * d;
            }
    rstd = rsqrtf(warp_sum(q) / C + eps);
}
}  // namespace gold

namespace gold {
// One warp per row of C elements: optional residual (s = round_T(x + r), written to s_out), LayerNorm over C in
// float32 registers, y = (s - mean) * rstd * w + b written once. 16-byte (or VEC-element) loads and stores.
template <typename T, int VEC, int NJ, bool RES>
__global__ void __launch_bounds__(256) ln_rows_kernel(const T* __restrict__ x, const T* __restrict__ r,
                                                      T* __restrict__ s_out, const T* __restrict__ w,
                                                      const T* __restrict__ b, T* __restrict__ y, int64_t rows, int C,
                                                      float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    float v[NJ][VEC];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int q = (lane + 32 * j) * VEC;
        if (q < C) {
            ldv_cs<T, VEC>(x + row * C + q, v[j]);
            if (RES) {
                float rr[VEC];
                ldv_cs<T, VEC>(r + row * C + q, rr);
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[j][e] = rnd<T>(v[j][e] + rr[e]);
                stv<T, VEC>(s_out + row * C + q, v[j]);
            }
        }
    }
    float mean, rstd;
    warp_ln_stats<VEC, NJ>(v, lane, C, eps, mean, rstd);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int q = (lane + 32 * j) * VEC;
        if (q < C) {
            float g[VEC], bb[VEC], o[VEC];
            ldv<T, VEC>(w + q, g);
            ldv<T, VEC>(b + q, bb);
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] = (v[j][e] - mean) * rstd * g[e] + bb[e];
            stv<T, VEC>(y + row * C + q, o);
        }
    }
}

template <typename T, int VEC, int NJ, bool RES>
inline void ln_rows(const void* x, const void* r, void* s_out, const void* w, const void* b, void* y, int64_t rows,
                    int C, float eps) {
    TORCH_CHECK(C % VEC == 0 && C <= 32 * VEC * NJ, "ln_rows: C = ", C, " does not fit VEC = ", VEC, ", NJ = ", NJ);
    if (rows == 0) return;
    const int64_t blocks = (rows + 7) / 8;
    ln_rows_kernel<T, VEC, NJ, RES><<<(unsigned)blocks, 256, 0, at::cuda::getCurrentCUDAStream().stream()>>>(
        static_cast<const T*>(x), static_cast<const T*>(r), static_cast<T*>(s_out), static_cast<const T*>(w),
        static_cast<const T*>(b), static_cast<T*>(y), rows, C, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
}  // namespace gold

namespace gold {
// 3xTF32 (float32-accurate GEMM on TF32 tensor cores): x = hi + lo with hi = x rounded to TF32 (cvt.rna) and
// lo = x - hi (exact in float32). A W^T = Ahi Whi^T + Alo Whi^T + Ahi Wlo^T + O(2^-22 |A||W|): the operands are laid
// out along K as A3 = [Ahi | Alo | Ahi] and W3 = [Whi | Whi | Wlo], so one GEMM over 3K computes all three terms
// (the Alo Wlo term is below float32 resolution). Technique: "3xTF32" of NVIDIA CUTLASS (examples 27/28).
__device__ __forceinline__ float tf32_hi(float x) {
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

// W (N, K) float32 -> W3 (N, 3K) = [hi | hi | lo]
__global__ void __launch_bounds__(256) tf32x3_weight_kernel(const float* __restrict__ w, float* __restrict__ w3,
                                                            int64_t N, int K) {
    const int64_t n = N * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K;
        const int c = (int)(i % K);
        const float x = w[i], hi = tf32_hi(x);
        float* o = w3 + r * 3 * K;
        o[c] = hi;
        o[K + c] = hi;
        o[2 * K + c] = x - hi;
    }
}

inline void tf32x3_weight(const float* w, float* w3, int64_t N, int64_t K) {
    const int64_t n = N * K;
    if (n == 0) return;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1024);
    tf32x3_weight_kernel<<<(unsigned)blocks, 256, 0, at::cuda::getCurrentCUDAStream().stream()>>>(w, w3, N, (int)K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A3 (M, 3K) x W3 (N, 3K)^T (+ bias, epilogue) on TF32 tensor cores; where cuBLASLt has no TF32 algorithm the same
// operands go through the plain float32 GEMM (exact products, the same float32 accuracy).
inline void tf32x3_linear(const float* A3, const float* W3, const float* bias, float* D, int64_t M, int64_t N,
                          int64_t K, cublasLtEpilogue_t epi, const torch::Device& device) {
    if (lt_linear_try(A3, W3, bias, nullptr, D, M, N, 3 * K, CUDA_R_32F, epi, 0.f, device, CUBLAS_COMPUTE_32F_FAST_TF32))
        return;
    lt_linear(A3, W3, bias, nullptr, D, M, N, 3 * K, CUDA_R_32F, epi, 0.f, device);
}
}  // namespace gold
