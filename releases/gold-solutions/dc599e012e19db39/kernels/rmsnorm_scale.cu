// RMSNorm over the last dim (128, no affine) times a constant, bfloat16, one pass over memory.
// Design: 16 lanes per row, each lane one 16-byte load (8 bf16) per row, two rows per thread issued before the
// reductions (more bytes in flight), half-warp shuffle sums, float32 math, the normalised value rounded to bf16
// (as torch's RMSNorm returns it) before the scale and the final bf16 store.
// Bytes: read 2 B + write 2 B per element: 32 x 729 x 16 x 128 -> 191 MB; at ~4.3 TB/s achievable on an H200
// ~0.045 ms predicted vs roofline 0.040 ms and torch.compile 0.119 ms.
#include "registry.h"
#include "gold_common.cuh"

using bf16 = __nv_bfloat16;

template <int LPR, int RPT>
__global__ void __launch_bounds__(256) rms_scale_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t rows,
                                                        float eps, float scale) {
    constexpr int C = LPR * 8;
    const int sub = threadIdx.x % LPR;
    const int per_iter = blockDim.x / LPR;
    const int64_t base = (int64_t)blockIdx.x * per_iter * RPT + threadIdx.x / LPR;
    float v[RPT][8];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const int64_t row = base + (int64_t)r * per_iter;
        if (row < rows) {
            gold::ldv_cs<bf16, 8>(x + row * C + sub * 8, v[r]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[r][i] = 0.f;
        }
    }
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += v[r][i] * v[r][i];
        ss = gold::warp_sum<LPR>(ss);
        const float rstd = rsqrtf(ss / C + eps);
        const int64_t row = base + (int64_t)r * per_iter;
        if (row < rows) {
            float o[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = gold::rnd<bf16>(v[r][i] * rstd) * scale;
            gold::stv<bf16, 8>(y + row * C + sub * 8, o);
        }
    }
}

torch::Tensor rmsnorm_scale(torch::Tensor x, double eps, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "rmsnorm_scale: bfloat16 CUDA tensor expected");
    auto xc = x.contiguous();
    const int64_t C = xc.size(-1);
    TORCH_CHECK(C == 128, "rmsnorm_scale: last dim 128 expected, got ", C);
    TORCH_CHECK(reinterpret_cast<uintptr_t>(xc.data_ptr()) % 16 == 0, "rmsnorm_scale: 16-byte aligned input expected");
    auto y = torch::empty_like(xc);
    const int64_t rows = xc.numel() / C;
    if (rows == 0) return y;
    constexpr int LPR = 16, RPT = 2, THREADS = 256;
    const int64_t rows_per_block = (THREADS / LPR) * RPT;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    rms_scale_kernel<LPR, RPT><<<(unsigned)blocks, THREADS, 0, at::cuda::getCurrentCUDAStream().stream()>>>(
        reinterpret_cast<const bf16*>(xc.data_ptr()), reinterpret_cast<bf16*>(y.data_ptr()), rows, (float)eps,
        (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
OPFORGE_EXPORT(rmsnorm_scale, "bf16(bf16(x * rsqrt(mean(x^2, -1) + eps)) * scale), last dim 128");
