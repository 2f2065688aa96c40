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
    const int blocks = (int)std::min<int64_t>((npix + threads - 1) / threads, (int64_t)sms * 16);
    const size_t smem = (size_t)(cout * cin * kh * kw + cout) * sizeof(float);
    conv_norm_kernel<<<blocks, threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
        npix, cin, cout, H, W, kh, kw, OH, OW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(conv_mul_normalize_sq_exp, "Conv2d -> * y -> normalize(dim=1) -> square -> exp, one kernel");
