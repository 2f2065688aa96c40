// BatchNorm(eval) -> SiLU -> ZeroPad2d(1,2,1,2) -> depthwise 5x5 stride-2 conv -> BatchNorm(eval), float32, one pass.
// Design: one block per (image, channel, chunk of R = 25 output rows). The block folds both BatchNorms into
// per-channel scale / shift, stages the 2R+3 input rows it needs in shared memory with BN1 + SiLU applied (the
// zero padding is written as zeros, as ZeroPad2d pads after the activation), then computes its R x OW outputs
// from shared memory with the 25 taps in registers and BN2 applied on the way out.
// Bytes (N = 32): x 829 MB read (+6 % halo rows re-read, mostly L2 hits) + 207 MB written = 1.04 GB -> about
// 0.26-0.3 ms on an H200 (roofline_ms 0.216, compile_ms 1.44).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int R = 25;  // output rows per block

__global__ void __launch_bounds__(256) bn_silu_dwconv_bn(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ g1, const float* __restrict__ b1,
    const float* __restrict__ m1, const float* __restrict__ v1, float eps1, const float* __restrict__ g2,
    const float* __restrict__ b2, const float* __restrict__ m2, const float* __restrict__ v2, float eps2,
    float* __restrict__ out, int C, int H, int W, int OH, int OW) {
    extern __shared__ float tile[];
    const int64_t plane = blockIdx.y;
    const int c = (int)(plane % C);
    const int oh0 = blockIdx.x * R;
    const float s1 = g1[c] * rsqrtf(v1[c] + eps1), t1 = b1[c] - m1[c] * s1;
    const float s2 = g2[c] * rsqrtf(v2[c] + eps2), t2 = b2[c] - m2[c] * s2;
    const int SW = W + 3, TR = 2 * R + 3;
    const int ih0 = 2 * oh0 - 1;
    const float* xp = x + plane * H * W;
    const int total = TR * SW;
#pragma unroll 4
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int r = i / SW, cc = i - r * SW;
        const int ih = ih0 + r, iw = cc - 1;
        float v = 0.f;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
            const float a = __ldg(xp + ih * W + iw) * s1 + t1;
            v = a / (1.f + __expf(-a));
        }
        tile[i] = v;
    }
    float wk[25];
#pragma unroll
    for (int k = 0; k < 25; ++k) wk[k] = w[c * 25 + k];
    __syncthreads();
    const int rows = min(R, OH - oh0);
    float* op = out + (plane * OH + oh0) * OW;
    for (int o = threadIdx.x; o < rows * OW; o += blockDim.x) {
        const int r = o / OW, ow = o - r * OW;
        const float* tp = tile + (2 * r) * SW + 2 * ow;
        float acc = 0.f;
#pragma unroll
        for (int kh = 0; kh < 5; ++kh)
#pragma unroll
            for (int kw = 0; kw < 5; ++kw) acc = fmaf(wk[kh * 5 + kw], tp[kh * SW + kw], acc);
        op[o] = fmaf(acc, s2, t2);
    }
}

torch::Tensor bn_silu_dwconv_bn_forward(torch::Tensor x, torch::Tensor w, torch::Tensor g1, torch::Tensor b1,
                                        torch::Tensor m1, torch::Tensor v1, double eps1, torch::Tensor g2,
                                        torch::Tensor b2, torch::Tensor m2, torch::Tensor v2, double eps2) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 4, "x: float32 CUDA NCHW expected");
    TORCH_CHECK(w.numel() == x.size(1) * 25, "weight: (C, 1, 5, 5) expected");
    x = x.contiguous();
    const int N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int OH = (H + 3 - 5) / 2 + 1, OW = (W + 3 - 5) / 2 + 1;
    auto out = torch::empty({N, C, OH, OW}, x.options());
    const size_t smem = (size_t)(2 * R + 3) * (W + 3) * sizeof(float);
    TORCH_CHECK(smem <= 200 * 1024, "image too wide for the shared-memory tile");
    static bool attr_set = false;
    if (!attr_set) {
        cudaFuncSetAttribute(bn_silu_dwconv_bn, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        attr_set = true;
    }
    dim3 grid((OH + R - 1) / R, (unsigned)((int64_t)N * C));
    auto c = [](torch::Tensor t) { return t.contiguous().data_ptr<float>(); };
    bn_silu_dwconv_bn<<<grid, 256, smem, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), c(w), c(g1), c(b1), c(m1), c(v1), (float)eps1, c(g2), c(b2), c(m2), c(v2), (float)eps2,
        out.data_ptr<float>(), C, H, W, OH, OW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
