// F.unfold(x, kernel (kh, kw), stride 1, no padding / dilation) + y -> exact GELU, float32.
// x [B, C, H, W]; y / out [B, C*kh*kw, L] with L = OH*OW. The kh*kw rows of one (b, c) "group" are contiguous in
// y / out and all read the same x plane [H, W] (L1-resident), so a thread owns one position l of a group and walks
// its kh*kw rows: coalesced loads / stores along l, no index division per element, the unfold never materialised.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

__global__ void unfold_gelu_groups(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                                   int64_t ngroups, int kh, int kw, int L, int OW, int H, int W) {
    const int kk = kh * kw;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.y + threadIdx.y; g < ngroups; g += (int64_t)gridDim.x * blockDim.y) {
        const float* xp = x + g * (int64_t)H * W;
        const int64_t base = g * (int64_t)kk * L;
        for (int l = threadIdx.x; l < L; l += blockDim.x) {
            const int oh = l / OW, ow = l - (l / OW) * OW;
            for (int r0 = 0; r0 < kk; r0 += 4) {
                float yv[4], xv[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (r0 + u < kk) {
                        const int r = r0 + u, i = r / kw, j = r - (r / kw) * kw;
                        yv[u] = __ldcs(y + base + (int64_t)r * L + l);
                        xv[u] = __ldg(xp + (oh + i) * W + ow + j);
                    }
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (r0 + u < kk) __stcs(out + base + (int64_t)(r0 + u) * L + l, gelu(xv[u] + yv[u]));
            }
        }
    }
}

// Fast path with the kernel size fixed at compile time: a thread handles position l of G groups at once, so all
// G*KH*KW y loads (and the x taps, L1 hits) are in flight together before any GELU is computed.
template <int KH, int KW, int G>
__global__ void __launch_bounds__(640) unfold_gelu_fixed(const float* __restrict__ x, const float* __restrict__ y,
                                                         float* __restrict__ out, int64_t ngroups, int L, int OW, int H,
                                                         int W) {
    constexpr int KK = KH * KW;
    const int l = threadIdx.x;
    if (l >= L) return;
    const int oh = l / OW, ow = l - (l / OW) * OW;
    const int64_t step = (int64_t)gridDim.x * blockDim.y * G;
    for (int64_t g0 = ((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * G; g0 < ngroups; g0 += step) {
        float yv[G][KK], xv[G][KK];
#pragma unroll
        for (int u = 0; u < G; ++u) {
            const int64_t g = min(g0 + u, ngroups - 1);  // clamped groups are loaded but not stored
            const float* xp = x + g * (int64_t)H * W + oh * W + ow;
            const float* yp = y + g * (int64_t)KK * L + l;
#pragma unroll
            for (int i = 0; i < KH; ++i)
#pragma unroll
                for (int j = 0; j < KW; ++j) {
                    yv[u][i * KW + j] = __ldcs(yp + (int64_t)(i * KW + j) * L);
                    xv[u][i * KW + j] = __ldg(xp + i * W + j);
                }
        }
#pragma unroll
        for (int u = 0; u < G; ++u) {
            if (g0 + u >= ngroups) break;
            float* op = out + (g0 + u) * (int64_t)KK * L + l;
#pragma unroll
            for (int r = 0; r < KK; ++r) __stcs(op + (int64_t)r * L, gelu(xv[u][r] + yv[u][r]));
        }
    }
}

torch::Tensor unfold_add_gelu(torch::Tensor x, torch::Tensor y, int64_t kh, int64_t kw) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 4, "x: [B, C, H, W] float32 CUDA tensor expected");
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OH = H - kh + 1, OW = W - kw + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "unfold_add_gelu: kernel larger than the input");
    TORCH_CHECK(y.dim() == 3 && y.size(0) == B && y.size(1) == C * kh * kw && y.size(2) == OH * OW &&
                    y.scalar_type() == torch::kFloat,
                "y must be [B, C*kh*kw, OH*OW] float32");
    auto out = torch::empty_like(y);
    if (y.numel() == 0) return out;
    const int L = (int)(OH * OW);
    const int sms0 = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (kh == 2 && kw == 2 && L <= 640) {
        constexpr int G = 4;
        const int fbx = ((L + 31) / 32) * 32;
        const int fby = std::max(1, 640 / fbx);
        const int64_t ng = B * C;
        const int64_t per_block = (int64_t)fby * G;
        const int blocks = (int)std::min<int64_t>((ng + per_block - 1) / per_block, (int64_t)sms0 * 8);
        unfold_gelu_fixed<2, 2, G><<<blocks, dim3(fbx, fby), 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), ng, L, (int)OW, (int)H, (int)W);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return out;
    }
    const int bx = (int)std::min<int64_t>(((L + 31) / 32) * 32, 256);
    const int by = std::max(1, 640 / bx);
    const int64_t ngroups = B * C;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = (int)std::min<int64_t>((ngroups + by - 1) / by, (int64_t)sms * 24);
    unfold_gelu_groups<<<blocks, dim3(bx, by), 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), ngroups, (int)kh, (int)kw, L, (int)OW,
        (int)H, (int)W);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(unfold_add_gelu, "F.unfold (stride 1) + y -> exact GELU without materialising the unfold");
