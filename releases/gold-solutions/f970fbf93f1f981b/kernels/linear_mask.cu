// out = masked_fill(x @ W^T + b, mask, value), bfloat16. x [..., K], W [N, K], b [N], mask bool [..., N].
// Per chunk of Mc rows: cuBLASLt bf16 GEMM (fp32 accumulate, BIAS epilogue) writes out[m0:m0+Mc], then mask_fill
// rewrites the chunk in place while it is still in L2 (chunk output ~16 MB, mask ~8 MB).
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <map>
#include <mutex>
#include <tuple>

#define LT_CHECK(expr)                                                                              \
    do {                                                                                            \
        cublasStatus_t st_ = (expr);                                                                \
        TORCH_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call failed: ", #expr, " status ", (int)st_); \
    } while (0)

static cublasLtHandle_t lt_handle() {
    static std::mutex mu;
    static std::map<int, cublasLtHandle_t> handles;  // one per device, created once
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto it = handles.find(dev);
    if (it != handles.end()) return it->second;
    cublasLtHandle_t h;
    LT_CHECK(cublasLtCreate(&h));
    handles[dev] = h;
    return h;
}

constexpr size_t kWorkspace = 32u << 20;

// D[N, Mc] (column-major, ld N) = W^T-view [N, K] x X^T-view [K, Mc] + bias: i.e. row-major out[Mc, N] = x W^T + b.
static void gemm_bias(cublasLtHandle_t h, cudaStream_t stream, const __nv_bfloat16* x, const __nv_bfloat16* w,
                      const __nv_bfloat16* bias, __nv_bfloat16* out, int64_t Mc, int64_t N, int64_t K, void* ws) {
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    cudaDataType_t bt = CUDA_R_16BF;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    cublasLtMatrixLayout_t la, lb, lc;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, Mc, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, Mc, N));

    static std::mutex mu;
    static std::map<std::tuple<int64_t, int64_t, int64_t, int>, cublasLtMatmulAlgo_t> algos;  // by (Mc, N, K, device)
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    cublasLtMatmulAlgo_t algo;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto key = std::make_tuple(Mc, N, K, dev);
        auto it = algos.find(key);
        if (it == algos.end()) {
            cublasLtMatmulPreference_t pref;
            LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
            size_t wsz = kWorkspace;
            LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof(wsz)));
            cublasLtMatmulHeuristicResult_t res;
            int found = 0;
            LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found));
            cublasLtMatmulPreferenceDestroy(pref);
            TORCH_CHECK(found > 0, "cuBLASLt: no algorithm for the bias GEMM");
            it = algos.emplace(key, res.algo).first;
        }
        algo = it->second;
    }
    const float alpha = 1.f, beta = 0.f;
    LT_CHECK(cublasLtMatmul(h, op, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &algo, ws, kWorkspace, stream));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
}

// 16 elements per thread: one 16-byte mask load, two 16-byte output loads / stores.
__global__ void mask_fill_vec16(uint4* __restrict__ out, const uint4* __restrict__ mask, int64_t n16, __nv_bfloat16 value) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 m = __ldcs(mask + i);
        if ((m.x | m.y | m.z | m.w) == 0u) continue;
        const unsigned char* mb = reinterpret_cast<const unsigned char*>(&m);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            uint4 o = out[2 * i + half];
            __nv_bfloat16* oh = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (mb[half * 8 + u]) oh[u] = value;
            out[2 * i + half] = o;
        }
    }
}

__global__ void mask_fill_scalar(__nv_bfloat16* __restrict__ out, const bool* __restrict__ mask, int64_t start, int64_t n,
                                 __nv_bfloat16 value) {
    for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (mask[i]) out[i] = value;
}

torch::Tensor linear_bias_masked_fill(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor mask, double value) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x: bfloat16 CUDA tensor expected");
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kBFloat16 && bias.dim() == 1 && bias.size(0) == w.size(0),
                "weight [N, K] and bias [N] bfloat16 expected");
    const int64_t N = w.size(0), K = w.size(1);
    TORCH_CHECK(x.size(-1) == K, "x's last dimension must be in_features");
    const int64_t M = x.numel() / K;
    TORCH_CHECK(mask.scalar_type() == torch::kBool && mask.numel() == M * N && mask.size(-1) == N,
                "mask must be bool with the output's shape");
    auto sizes = x.sizes().vec();
    sizes.back() = N;
    auto out = torch::empty(sizes, x.options());
    if (M == 0) return out;
    auto ws = torch::empty({(int64_t)kWorkspace}, x.options().dtype(torch::kByte));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    cublasLtHandle_t h = lt_handle();
    // rows per chunk: output chunk about 16 MB, a multiple of 128 rows (keeps every chunk pointer 16-byte aligned)
    int64_t Mc = std::max<int64_t>(128, ((16ll << 20) / (2 * N)) / 128 * 128);
    const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
    const auto* wp = reinterpret_cast<const __nv_bfloat16*>(w.data_ptr());
    const auto* bp = reinterpret_cast<const __nv_bfloat16*>(bias.data_ptr());
    auto* op = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
    const auto* mp = reinterpret_cast<const bool*>(mask.data_ptr());
    const __nv_bfloat16 val = __float2bfloat16_rn((float)value);
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const bool vec = N % 16 == 0 && reinterpret_cast<uintptr_t>(mp) % 16 == 0 && reinterpret_cast<uintptr_t>(op) % 16 == 0;
    for (int64_t m0 = 0; m0 < M; m0 += Mc) {
        const int64_t mc = std::min(Mc, M - m0);
        gemm_bias(h, stream, xp + m0 * K, wp, bp, op + m0 * N, mc, N, K, ws.data_ptr());
        const int64_t n = mc * N;
        if (vec) {
            const int64_t n16 = n / 16;
            const int blocks = (int)std::min<int64_t>((n16 + 255) / 256, (int64_t)sms * 8);
            mask_fill_vec16<<<blocks, 256, 0, stream>>>(reinterpret_cast<uint4*>(op + m0 * N),
                                                        reinterpret_cast<const uint4*>(mp + m0 * N), n16, val);
        } else {
            const int blocks = (int)std::min<int64_t>((n + 255) / 256, (int64_t)sms * 8);
            mask_fill_scalar<<<blocks, 256, 0, stream>>>(op + m0 * N, mp + m0 * N, 0, n, val);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
OPFORGE_EXPORT(linear_bias_masked_fill, "Linear (cuBLASLt, bias epilogue) -> masked_fill, L2-chunked, bfloat16");
