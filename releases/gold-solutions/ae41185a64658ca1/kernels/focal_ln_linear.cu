// FocalNet patch-embedding tail, float32: x (B, C, H, W) -> v2 = LN1(x.flatten(2).transpose(1, 2)) (B, HW, C),
// v3 = LN2(v2), v5 = v3 @ W^T + bias (B, H, W, N).
// Design: kernel 1 stages a (C x TS) tile of x through shared memory (the transpose is never materialised), one
// warp per token runs both LayerNorms in registers (two-pass each) and writes v2 (an output) and the GEMM operand
// once, already split for 3xTF32: A3 = [hi | lo | hi] of v3 (see gold_common.cuh). The Linear is one cuBLASLt GEMM
// over K' = 3 x 192 on TF32 tensor cores with the bias in its epilogue, float32-accurate (error ~2^-22 relative per
// product, not TF32's 2^-11), writing v5 directly; W3 = [hi | hi | lo] of the weight is rebuilt each call (74 K
// elements, no state kept).
// Bytes: x 38.5 MB + v2 38.5 MB + A3 116 MB (written, re-read) + v5 77.7 MB -> ~0.08 ms of traffic; 22.4 GFLOP TF32.
// Predicted ~0.11-0.13 ms vs roofline 0.111 ms (float32 FMA peak) and torch.compile 0.329 ms (float32 SGEMM).
#include "registry.h"
#include "gold_common.cuh"

template <int NJ, int TS, int NW>
__global__ void __launch_bounds__(NW * 32) transpose_ln_ln_kernel(const float* __restrict__ x, const float* __restrict__ w1,
                                                                  const float* __restrict__ b1, const float* __restrict__ w2,
                                                                  const float* __restrict__ b2, float* __restrict__ v2,
                                                                  float* __restrict__ a3, int S, float eps1, float eps2) {
    constexpr int C = NJ * 32;
    constexpr int LD = C + 1;
    extern __shared__ float sm[];  // [TS][C + 1]
    const int bi = blockIdx.y;
    const int s0 = blockIdx.x * TS;
    const int ts = min(TS, S - s0);
    const float* xb = x + (int64_t)bi * C * S + s0;
    if ((S & 3) == 0) {  // 16-byte loads along s, all issued before the shared stores
        constexpr int Q = TS / 4;
        constexpr int PER = (C * Q + NW * 32 - 1) / (NW * 32);
        float4 buf[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int idx = threadIdx.x + k * NW * 32;
            const int c = idx / Q, s = (idx % Q) * 4;
            if (idx < C * Q && s < ts) buf[k] = __ldcs(reinterpret_cast<const float4*>(xb + (int64_t)c * S + s));
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int idx = threadIdx.x + k * NW * 32;
            const int c = idx / Q, s = (idx % Q) * 4;
            if (idx < C * Q && s < ts) {
                sm[s * LD + c] = buf[k].x;
                sm[(s + 1) * LD + c] = buf[k].y;
                sm[(s + 2) * LD + c] = buf[k].z;
                sm[(s + 3) * LD + c] = buf[k].w;
            }
        }
    } else {
        for (int idx = threadIdx.x; idx < C * TS; idx += NW * 32) {
            const int c = idx / TS, s = idx % TS;
            if (s < ts) sm[s * LD + c] = __ldcs(xb + (int64_t)c * S + s);
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int s = warp; s < ts; s += NW) {
        const int64_t row = (int64_t)bi * S + s0 + s;
        float v[NJ][1];
#pragma unroll
        for (int j = 0; j < NJ; ++j) v[j][0] = sm[s * LD + lane + 32 * j];
        float mean, rstd;
        gold::warp_ln_stats<1, NJ>(v, lane, C, eps1, mean, rstd);
        float* o2 = v2 + row * C;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            v[j][0] = (v[j][0] - mean) * rstd * __ldg(w1 + lane + 32 * j) + __ldg(b1 + lane + 32 * j);
            __stcs(o2 + lane + 32 * j, v[j][0]);
        }
        gold::warp_ln_stats<1, NJ>(v, lane, C, eps2, mean, rstd);
        float* o3 = a3 + row * 3 * C;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float t = (v[j][0] - mean) * rstd * __ldg(w2 + lane + 32 * j) + __ldg(b2 + lane + 32 * j);
            const float hi = gold::tf32_hi(t);
            o3[lane + 32 * j] = hi;
            o3[C + lane + 32 * j] = t - hi;
            o3[2 * C + lane + 32 * j] = hi;
        }
    }
}

std::vector<torch::Tensor> focal_ln_linear(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, double eps1,
                                           torch::Tensor w2, torch::Tensor b2, double eps2, torch::Tensor lw,
                                           torch::Tensor lb) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 4, "focal_ln_linear: float32 (B, C, H, W) CUDA tensor expected");
    auto xc = x.contiguous();
    const int64_t B = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3), S = H * W;
    TORCH_CHECK(C == 192, "focal_ln_linear: C = 192 expected, got ", C);
    auto lwc = lw.contiguous(), lbc = lb.contiguous();
    const int64_t N = lwc.size(0);
    TORCH_CHECK(lwc.size(1) == C, "focal_ln_linear: linear weight shape");
    auto v2 = torch::empty({B, S, C}, xc.options());
    auto a3 = torch::empty({B * S, 3 * C}, xc.options());
    auto w3 = torch::empty({N, 3 * C}, xc.options());
    auto v5 = torch::empty({B, H, W, N}, xc.options());
    if (B * S == 0) return {v2, v5};
    constexpr int NJ = 6, TS = 28, NW = 7;
    const size_t smem = (size_t)TS * (NJ * 32 + 1) * sizeof(float);
    dim3 grid((unsigned)((S + TS - 1) / TS), (unsigned)B);
    transpose_ln_ln_kernel<NJ, TS, NW><<<grid, NW * 32, smem, at::cuda::getCurrentCUDAStream().stream()>>>(
        xc.data_ptr<float>(), w1.contiguous().data_ptr<float>(), b1.contiguous().data_ptr<float>(),
        w2.contiguous().data_ptr<float>(), b2.contiguous().data_ptr<float>(), v2.data_ptr<float>(), a3.data_ptr<float>(),
        (int)S, (float)eps1, (float)eps2);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    gold::tf32x3_weight(lwc.data_ptr<float>(), w3.data_ptr<float>(), N, C);
    gold::tf32x3_linear(a3.data_ptr<float>(), w3.data_ptr<float>(), lbc.data_ptr<float>(), v5.data_ptr<float>(), B * S, N,
                        C, CUBLASLT_EPILOGUE_BIAS, xc.device());
    return {v2, v5};
}
OPFORGE_EXPORT(focal_ln_linear, "(LN1(x.flatten(2).T), Linear(LN2(LN1(...))) as (B, H, W, N)), float32, C = 192");
