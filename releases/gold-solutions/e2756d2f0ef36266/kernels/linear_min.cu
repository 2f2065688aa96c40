// min_n( half(half(x @ W^T + b)[n] + y[n]) ) per row, float16. x [..., K], y [..., N], W [N, K], b [N]; K, N <= 64.
// One thread per row; y read as 16-byte vectors when N % 8 == 0 (rows are then 16-byte aligned), else as halves.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>

constexpr int kMax = 64;

template <bool kVec, int KT>
__global__ void linear_add_min_kernel(const __half* __restrict__ x, const __half* __restrict__ y,
                                      const __half* __restrict__ w, const __half* __restrict__ bias,
                                      __half* __restrict__ out, int64_t rows, int K_, int N) {
    const int K = KT > 0 ? KT : K_;  // compile-time K keeps the row of x in registers
    __shared__ float sw[kMax * kMax];
    __shared__ float sb[kMax];
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) sw[i] = __half2float(w[i]);
    for (int i = threadIdx.x; i < N; i += blockDim.x) sb[i] = __half2float(bias[i]);
    __syncthreads();
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        float xv[kMax];
        const __half* xr = x + r * K;
        for (int k = 0; k < K; ++k) xv[k] = __half2float(__ldcs(xr + k));
        float m = INFINITY;
        const __half* yr = y + r * N;
        if (kVec) {
            for (int n0 = 0; n0 < N; n0 += 8) {
                const uint4 yv = __ldcs(reinterpret_cast<const uint4*>(yr + n0));
                const __half* yh = reinterpret_cast<const __half*>(&yv);
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int n = n0 + u;
                    float acc = 0.f;
                    for (int k = 0; k < K; ++k) acc = fmaf(xv[k], sw[n * K + k], acc);
                    const float lin = __half2float(__float2half_rn(acc + sb[n]));
                    m = fminf(m, __half2float(__float2half_rn(lin + __half2float(yh[u]))));
                }
            }
        } else {
            for (int n = 0; n < N; ++n) {
                float acc = 0.f;
                for (int k = 0; k < K; ++k) acc = fmaf(xv[k], sw[n * K + k], acc);
                const float lin = __half2float(__float2half_rn(acc + sb[n]));
                m = fminf(m, __half2float(__float2half_rn(lin + __half2float(yr[n]))));
            }
        }
        out[r] = __float2half_rn(m);
    }
}

torch::Tensor linear_add_min(torch::Tensor x, torch::Tensor y, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf, "x: float16 CUDA tensor expected");
    TORCH_CHECK(w.dim() == 2 && bias.dim() == 1 && w.size(0) == bias.size(0), "weight [N, K] and bias [N] expected");
    const int N = (int)w.size(0), K = (int)w.size(1);
    TORCH_CHECK(N <= kMax && K <= kMax && N > 0, "linear_add_min: at most 64 input and output features");
    TORCH_CHECK(x.size(-1) == K && y.size(-1) == N && y.numel() / N == x.numel() / K && y.scalar_type() == torch::kHalf,
                "x [..., K] and y [..., N] with the same leading shape expected");
    auto sizes = x.sizes().vec();
    sizes.back() = 1;
    auto out = torch::empty(sizes, x.options());
    const int64_t rows = x.numel() / K;
    if (rows == 0) return out;
    const int threads = 256;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = (int)std::min<int64_t>((rows + threads - 1) / threads, (int64_t)sms * 16);
    auto stream = at::cuda::getCurrentCUDAStream();
    const auto* xp = reinterpret_cast<const __half*>(x.data_ptr());
    const auto* yp = reinterpret_cast<const __half*>(y.data_ptr());
    const auto* wp = reinterpret_cast<const __half*>(w.data_ptr());
    const auto* bp = reinterpret_cast<const __half*>(bias.data_ptr());
    auto* op = reinterpret_cast<__half*>(out.data_ptr());
    const bool vec = N % 8 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0;
    if (vec && K == 3)
        linear_add_min_kernel<true, 3><<<blocks, threads, 0, stream>>>(xp, yp, wp, bp, op, rows, K, N);
    else if (vec)
        linear_add_min_kernel<true, 0><<<blocks, threads, 0, stream>>>(xp, yp, wp, bp, op, rows, K, N);
    else
        linear_add_min_kernel<false, 0><<<blocks, threads, 0, stream>>>(xp, yp, wp, bp, op, rows, K, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(linear_add_min, "Linear -> + y -> min over the last dim (keepdim), float16, one kernel");
