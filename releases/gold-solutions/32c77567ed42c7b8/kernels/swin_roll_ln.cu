// Swin window reverse (2 x 2 windows of 7 x 7) + torch.roll(shifts=(3, 3)) + LayerNorm(384), float16.
// Design: the window permute and the roll are never materialised: one warp per OUTPUT token computes the source
// token of the (windows, 49, C) input (inverse roll, then window reverse) and gathers its row with 8-byte loads
// (3 per lane, C = 384), LayerNorm in float32 registers (two-pass), one 8-byte store per chunk.
// Bytes: read + write once: 2048 x 49 x 384 x 2 B x 2 = 154 MB -> ~0.036 ms predicted at ~4.3 TB/s
// (roofline 0.032 ms, torch.compile 0.125 ms).
#include "registry.h"
#include "gold_common.cuh"

template <typename T, int VEC, int NJ>
__global__ void __launch_bounds__(256) swin_roll_ln_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                           const T* __restrict__ b, T* __restrict__ y, int64_t rows,
                                                           int C, int ws, int nwh, int nww, int shift_h, int shift_w,
                                                           float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warp exits together
    const int H = ws * nwh, W = ws * nww;
    const int64_t bi = row / (H * W);
    const int pix = (int)(row % (H * W));
    const int i = pix / W, j = pix % W;
    // roll: out[i] = in[(i - shift) mod H]
    const int si = ((i - shift_h) % H + H) % H, sj = ((j - shift_w) % W + W) % W;
    // window reverse: (win_row a, h) x (win_col c, w) -> window (bi, a, c), token h * ws + w
    const int a = si / ws, h = si % ws, c = sj / ws, wi = sj % ws;
    const int64_t src = ((bi * nwh + a) * nww + c) * (int64_t)(ws * ws) + h * ws + wi;
    const T* xr = x + src * C;
    float v[NJ][VEC];
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        const int q = (lane + 32 * jj) * VEC;
        if (q < C) gold::ldv_cs<T, VEC>(xr + q, v[jj]);
    }
    float mean, rstd;
    gold::warp_ln_stats<VEC, NJ>(v, lane, C, eps, mean, rstd);
    T* yr = y + row * C;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        const int q = (lane + 32 * jj) * VEC;
        if (q < C) {
            float g[VEC], bb[VEC], o[VEC];
            gold::ldv<T, VEC>(w + q, g);
            gold::ldv<T, VEC>(b + q, bb);
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] = (v[jj][e] - mean) * rstd * g[e] + bb[e];
            gold::stv<T, VEC>(yr + q, o);
        }
    }
}

// x: (4 * B, ws * ws, C) windows -> y: (B, (2 ws)^2, C)
torch::Tensor swin_roll_ln(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t ws, int64_t shift,
                           double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf && x.dim() == 3, "swin_roll_ln: (windows, ws*ws, C) float16 CUDA tensor expected");
    auto xc = x.contiguous();
    const int64_t nwin = xc.size(0), C = xc.size(2);
    TORCH_CHECK(xc.size(1) == ws * ws && nwin % 4 == 0, "swin_roll_ln: bad window shape");
    TORCH_CHECK(C % 4 == 0 && C <= 32 * 4 * 3, "swin_roll_ln: C must be a multiple of 4 and <= 384");
    auto wc = weight.contiguous(), bc = bias.contiguous();
    const int64_t B = nwin / 4;
    const int64_t HW = 4 * ws * ws;
    auto y = torch::empty({B, HW, C}, xc.options());
    const int64_t rows = B * HW;
    if (rows == 0) return y;
    const int threads = 256;
    const int64_t blocks = (rows + 7) / 8;
    swin_roll_ln_kernel<__half, 4, 3><<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream().stream()>>>(
        reinterpret_cast<const __half*>(xc.data_ptr()), reinterpret_cast<const __half*>(wc.data_ptr()),
        reinterpret_cast<const __half*>(bc.data_ptr()), reinterpret_cast<__half*>(y.data_ptr()), rows, (int)C,
        (int)ws, 2, 2, (int)shift, (int)shift, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
OPFORGE_EXPORT(swin_roll_ln, "LayerNorm(roll(window_reverse(x), (shift, shift))), float16, 2 x 2 windows");
