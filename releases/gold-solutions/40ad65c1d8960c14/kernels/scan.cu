// elu -> abs -> hardtanh(lo, hi) -> cummin over dim 1 -> + y for a [B, S, C] float16 tensor.
// Thread = (b, 8 channels) when C % 8 == 0 (16-byte vectors), else (b, 1 channel); it walks s = 0..S-1.
// Numerics follow eager float16: elu is rounded to half, abs / clamp / min are exact on halves, the add rounds once.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float pre(__half h, float lo, float hi) {
    const float v = __half2float(h);
    const float e = v > 0.f ? v : expm1f(v);
    const float r = fabsf(__half2float(__float2half_rn(e)));
    return fminf(fmaxf(r, lo), hi);
}

constexpr int kUnroll = 8;  // 8 steps of x and y (256 bytes) in flight per thread

__global__ void scan_vec8(const uint4* __restrict__ x, const uint4* __restrict__ y, uint4* __restrict__ out,
                          int64_t ncols, int S, int C8, float lo, float hi) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= ncols) return;
    const int64_t b = t / C8;
    const int c = (int)(t - b * C8);
    const int64_t base = b * (int64_t)S * C8 + c;
    float m[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) m[i] = INFINITY;
    for (int s0 = 0; s0 < S; s0 += kUnroll) {
        uint4 xv[kUnroll], yv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (s0 + u < S) {
                xv[u] = __ldcs(x + base + (int64_t)(s0 + u) * C8);
                yv[u] = __ldcs(y + base + (int64_t)(s0 + u) * C8);
            }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (s0 + u < S) {
                const __half* xh = reinterpret_cast<const __half*>(&xv[u]);
                const __half* yh = reinterpret_cast<const __half*>(&yv[u]);
                uint4 o;
                __half* oh = reinterpret_cast<__half*>(&o);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    m[i] = fminf(m[i], pre(xh[i], lo, hi));
                    oh[i] = __float2half_rn(m[i] + __half2float(yh[i]));
                }
                __stcs(out + base + (int64_t)(s0 + u) * C8, o);
            }
    }
}

__global__ void scan_scalar(const __half* __restrict__ x, const __half* __restrict__ y, __half* __restrict__ out,
                            int64_t ncols, int S, int C, float lo, float hi) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= ncols) return;
    const int64_t b = t / C;
    const int c = (int)(t - b * C);
    const int64_t base = b * (int64_t)S * C + c;
    float m = INFINITY;
    for (int s = 0; s < S; ++s) {
        const int64_t i = base + (int64_t)s * C;
        m = fminf(m, pre(x[i], lo, hi));
        out[i] = __float2half_rn(m + __half2float(y[i]));
    }
}

torch::Tensor elu_abs_hardtanh_cummin_add(torch::Tensor x, torch::Tensor y, double lo, double hi) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf && x.dim() == 3, "x: [B, S, C] float16 CUDA tensor expected");
    TORCH_CHECK(y.sizes() == x.sizes() && y.scalar_type() == torch::kHalf, "y must match x in shape and dtype");
    auto out = torch::empty_like(x);
    const int64_t B = x.size(0);
    const int S = (int)x.size(1), C = (int)x.size(2);
    if (x.numel() == 0) return out;
    auto stream = at::cuda::getCurrentCUDAStream();
    const int threads = 128;
    const bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
    if (C % 8 == 0 && aligned) {
        const int64_t ncols = B * (C / 8);
        scan_vec8<<<(unsigned)((ncols + threads - 1) / threads), threads, 0, stream>>>(
            reinterpret_cast<const uint4*>(x.data_ptr()), reinterpret_cast<const uint4*>(y.data_ptr()),
            reinterpret_cast<uint4*>(out.data_ptr()), ncols, S, C / 8, (float)lo, (float)hi);
    } else {
        const int64_t ncols = B * C;
        scan_scalar<<<(unsigned)((ncols + threads - 1) / threads), threads, 0, stream>>>(
            reinterpret_cast<const __half*>(x.data_ptr()), reinterpret_cast<const __half*>(y.data_ptr()),
            reinterpret_cast<__half*>(out.data_ptr()), ncols, S, C, (float)lo, (float)hi);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(elu_abs_hardtanh_cummin_add, "elu -> abs -> hardtanh -> cummin(dim=1) -> + y (float16), one kernel");
