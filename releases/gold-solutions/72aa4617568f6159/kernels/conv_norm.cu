// Conv2d (stride 1, no padding) -> * y -> L2 normalize over channels (eps 1e-12) -> square -> exp, float32.
// One thread per output pixel; all output channels live in registers (C_out <= 32), weights in shared memory.
// Coalesced: consecutive threads take consecutive w, so every channel plane is read / written contiguously.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>

constexpr int kMaxCout = 32;

__global__ void conv_norm_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                 const float* __restrict__ wt, const float* __restrict__ bias, float* __restrict__ out,
                                 int64_t npix, int cin, int cout, int H, int W, int kh, int kw, int OH, int OW) {
    extern __shared__ float sw[];  // [cout * cin * kh * kw] weights, then [cout] bias
    const int nw = cout * cin * kh * kw;
    for (int i = threadIdx.x; i < nw; i += blockDim.x) sw[i] = wt[i];
    for (int i = threadIdx.x; i < cout; i += blockDim.x) sw[nw + i] = bias[i];
    __syncthreads();
    const int64_t plane = (int64_t)OH * OW;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < npix; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = p / plane;
        const int r = (int)(p - b * plane);
        const int oh = r / OW, ow = r - (r / OW) * OW;
        float acc[kMaxCout];
#pragma unroll
        for (int o = 0; o < kMaxCout; ++o) acc[o] = (o < cout) ? sw[nw + o] : 0.f;
        const float* xb = x + b * (int64_t)cin * H * W;
        for (int c = 0; c < cin; ++c) {
            for (int i = 0; i < kh; ++i) {
                for (int j = 0; j < kw; ++j) {
                    const float xv = __ldg(xb + ((int64_t)c * H + oh + i) * W + ow + j);
                    const int widx = (c * kh + i) * kw + j;
#pragma unroll
                    for (int o = 0; o < kMaxCout; ++o)
                        if (o < cout) acc[o] = fmaf(sw[o * cin * kh * kw + widx], xv, acc[o]);
                }
            }
        }
        const float* yb = y + b * (int64_t)cout * plane + r;
        float ss = 0.f;
#pragma unroll
        for (int o = 0; o < kMaxCout; ++o)
            if (o < cout) {
                acc[o] *= __ldcs(yb + (int64_t)o * plane);
                ss = fmaf(acc[o], acc[o], ss);
            }
        const float inv = 1.f / fmaxf(sqrtf(ss), 1e-12f);
        float* ob = out + b * (int64_t)cout * plane + r;
#pragma unroll
        for (int o = 0; o < kMaxCout; ++o)
            if (o < cout) {
                const float v = acc[o] * inv;
                __stcs(ob + (int64_t)o * plane, expf(v * v));
            }
    }
}

// Fast path, all sizes of the channel / kernel loops fixed at compile time: a thread computes PX consecutive output
// pixels of one output row (the PX+KW-1 input columns are loaded once per (c, i) and reused), every load is issued
// up front, the weights are read from shared memory as warp-wide broadcasts.
template <int CIN, int COUT, int KH, int KW, int PX>
__global__ void __launch_bounds__(256) conv_norm_fixed(const float* __restrict__ x, const float* __restrict__ y,
                                                       const float* __restrict__ wt, const float* __restrict__ bias,
                                                       float* __restrict__ out, int64_t nthreads, int H, int W, int OH,
                                                       int OW, int QW) {
    constexpr int NW = COUT * CIN * KH * KW;
    __shared__ float sw[NW + COUT];
    for (int i = threadIdx.x; i < NW; i += blockDim.x) sw[i] = wt[i];
    for (int i = threadIdx.x; i < COUT; i += blockDim.x) sw[NW + i] = bias[i];
    __syncthreads();
    const int64_t plane = (int64_t)OH * OW;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < nthreads; t += (int64_t)gridDim.x * blockDim.x) {
        const int q = (int)(t % QW);
        const int64_t bo = t / QW;
        const int oh = (int)(bo % OH);
        const int64_t b = bo / OH;
        const int ow0 = q * PX;
        const float* xb = x + b * (int64_t)CIN * H * W;
        float xin[CIN][KH][PX + KW - 1];
#pragma unroll
        for (int c = 0; c < CIN; ++c)
#pragma unroll
            for (int i = 0; i < KH; ++i)
#pragma unroll
                for (int j = 0; j < PX + KW - 1; ++j) {
                    const int col = min(ow0 + j, W - 1);  // clamped columns only feed pixels past the row end
                    xin[c][i][j] = __ldg(xb + ((int64_t)c * H + oh + i) * W + col);
                }
        const int64_t obase = b * (int64_t)COUT * plane + (int64_t)oh * OW + ow0;
        float yv[COUT][PX];
#pragma unroll
        for (int o = 0; o < COUT; ++o)
#pragma unroll
            for (int p = 0; p < PX; ++p) yv[o][p] = (ow0 + p < OW) ? __ldcs(y + obase + (int64_t)o * plane + p) : 0.f;
        float acc[COUT][PX];
#pragma unroll
        for (int o = 0; o < COUT; ++o) {
#pragma unroll
            for (int p = 0; p < PX; ++p) acc[o][p] = sw[NW + o];
#pragma unroll
            for (int c = 0; c < CIN; ++c)
#pragma unroll
                for (int i = 0; i < KH; ++i)
#pragma unroll
                    for (int j = 0; j < KW; ++j) {
                        const float wv = sw[((o * CIN + c) * KH + i) * KW + j];
#pragma unroll
                        for (int p = 0; p < PX; ++p) acc[o][p] = fmaf(wv, xin[c][i][p + j], acc[o][p]);
                    }
        }
#pragma unroll
        for (int p = 0; p < PX; ++p) {
            float ss = 0.f;
#pragma unroll
            for (int o = 0; o < COUT; ++o) {
                acc[o][p] *= yv[o][p];
                ss = fmaf(acc[o][p], acc[o][p], ss);
            }
            const float inv = 1.f / fmaxf(sqrtf(ss), 1e-12f);
            if (ow0 + p < OW) {
#pragma unroll
                for (int o = 0; o < COUT; ++o) {
                    const float v = acc[o][p] * inv;
                    __stcs(out + obase + (int64_t)o * plane + p, expf(v * v));
                }
            }
        }
    }
}

torch::Tensor conv_mul_normalize_sq_exp(torch::Tensor x, torch::Tensor y, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 4, "x: 4-D float32 CUDA tensor expected");
    TORCH_CHECK(w.dim() == 4 && w.size(1) == x.size(1), "weight must be [C_out, C_in, kh, kw] matching x");
    const int cout = (int)w.size(0), cin = (int)w.size(1), kh = (int)w.size(2), kw = (int)w.size(3);
    TORCH_CHECK(cout <= kMaxCout, "conv_mul_normalize_sq_exp: at most 32 output channels");
    const int B = (int)x.size(0), H = (int)x.size(2), W = (int)x.size(3);
    const int OH = H - kh + 1, OW = W - kw + 1;
    TORCH_CHECK(y.dim() == 4 && y.size(0) == B && y.size(1) == cout && y.size(2) == OH && y.size(3) == OW,
                "y must have the convolution's output shape");
    auto out = torch::empty({B, cout, OH, OW}, x.options());
    const int64_t npix = (int64_t)B * OH * OW;
    if (npix == 0) return out;
    const int threads = 256;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (cin == 9 && cout == 9 && kh == 2 && kw == 2) {
        constexpr int PX = 4;
        const int QW = (OW + PX - 1) / PX;
        const int64_t nthreads = (int64_t)B * OH * QW;
        const int blocks = (int)std::min<int64_t>((nthreads + threads - 1) / threads, (int64_t)sms * 16);
        conv_norm_fixed<9, 9, 2, 2, PX><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
            nthreads, H, W, OH, OW, QW);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return out;
    }
    const int blocks = (int)std::min<int64_t>((npix + threads - 1) / threads, (int64_t)sms * 16);
    const size_t smem = (size_t)(cout * cin * kh * kw + cout) * sizeof(float);
    conv_norm_kernel<<<blocks, threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
        npix, cin, cout, H, W, kh, kw, OH, OW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(conv_mul_normalize_sq_exp, "Conv2d -> * y -> normalize(dim=1) -> square -> exp, one kernel");
