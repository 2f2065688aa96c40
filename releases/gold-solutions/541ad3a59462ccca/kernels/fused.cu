// ResMLP token mixing: v0 = beta + alpha * x; v3 = token Linear of v0 + bt; v5 = x + ls1 * v3 (output 1);
// v6 = beta_1 + alpha_1 * v5 (output 2), bfloat16; the token Linear mixes over T (v3[t, c] = sum_s Wt[t, s] v0[s, c]).
// Design: (1) a 16-byte-vector pre-pass writes v0 = bf16(beta + alpha * x) exactly as the reference rounds it
// (moving the affine behind the GEMM by linearity skips that rounding, and with bf16's 8-bit mantissa the
// difference, summed over 196 tokens, put v5 up to 1.25 x the tolerance away from the reference);
// (2) cuBLASLt multiplies v0 (both transposes are operand layouts, strided batch per image, bf16 in / fp32
// accumulate, P stored as bf16 like the reference's matmul); (3) ONE 16-byte-vector epilogue kernel adds the bias,
// the layer scale, the residual and the second affine, rounding to bf16 after each op as the reference does
// (Linear on the non-contiguous transposed input is matmul, then add_ of the bias), writing both outputs.
// v0 lives in the v6 output buffer (v6 is written only after the GEMM has consumed it).
// Bytes (B = 128): pre-pass 19.3 MB read + 19.3 MB written; GEMM 19.3 + 19.3 MB; epilogue 38.5 + 38.5 MB
// -> about 45 us on an H200 (roofline_ms 0.012, compile_ms 0.083).
#include "lib.cuh"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float rb(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// v0 = bf16(beta[c] + alpha[c] * x) over (B*T, C); torch's addcmul: fp32 product, then fp32 add, one bf16 rounding
__global__ void affine_in(const bf16* __restrict__ x, const bf16* __restrict__ alpha, const bf16* __restrict__ beta,
                          bf16* __restrict__ v0, int64_t total, int C, bool vec) {
    if (vec) {
        const int64_t n8 = total / 8;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
            const int c0 = (int)((i * 8) % C);
            uint4 xr = reinterpret_cast<const uint4*>(x)[i], r;
            const bf16* xp = reinterpret_cast<const bf16*>(&xr);
            bf16* o = reinterpret_cast<bf16*>(&r);
#pragma unroll
            for (int q = 0; q < 8; ++q)
                o[q] = __float2bfloat16_rn(__fadd_rn(__bfloat162float(beta[c0 + q]),
                                                     __fmul_rn(__bfloat162float(alpha[c0 + q]), __bfloat162float(xp[q]))));
            reinterpret_cast<uint4*>(v0)[i] = r;
        }
    } else {
        for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
            const int c = (int)(e % C);
            v0[e] = __float2bfloat16_rn(__fadd_rn(__bfloat162float(beta[c]),
                                                  __fmul_rn(__bfloat162float(alpha[c]), __bfloat162float(x[e]))));
        }
    }
}

// the reference's op-by-op roundings: v3 = bf16(P + bt), v4 = bf16(ls1 * v3), v5 = bf16(x + v4),
// v6 = bf16(beta1 + alpha1 * v5)
__device__ __forceinline__ void epi(float p, float xv, int t, int c, const bf16* bt, const bf16* ls1,
                                    const bf16* beta1, const bf16* alpha1, bf16& o5, bf16& o6) {
    const float v3 = rb(__fadd_rn(p, __bfloat162float(bt[t])));
    const float v4 = rb(__fmul_rn(__bfloat162float(ls1[c]), v3));
    o5 = __float2bfloat16_rn(__fadd_rn(xv, v4));
    o6 = __float2bfloat16_rn(
        __fadd_rn(__bfloat162float(beta1[c]), __fmul_rn(__bfloat162float(alpha1[c]), __bfloat162float(o5))));
}

// over (B*T, C): 8 channels per step when C % 8 == 0
__global__ void epilogue(const bf16* __restrict__ P, const bf16* __restrict__ x, const bf16* __restrict__ bt,
                         const bf16* __restrict__ ls1, const bf16* __restrict__ beta1, const bf16* __restrict__ alpha1,
                         bf16* __restrict__ v5, bf16* __restrict__ v6, int64_t total, int T, int C, bool vec) {
    if (vec) {
        const int64_t n8 = total / 8;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t e = i * 8;
            const int c0 = (int)(e % C);
            const int t = (int)((e / C) % T);
            uint4 pr = reinterpret_cast<const uint4*>(P)[i], xr = reinterpret_cast<const uint4*>(x)[i];
            const bf16* pp = reinterpret_cast<const bf16*>(&pr);
            const bf16* xp = reinterpret_cast<const bf16*>(&xr);
            uint4 r5, r6;
            bf16* o5 = reinterpret_cast<bf16*>(&r5);
            bf16* o6 = reinterpret_cast<bf16*>(&r6);
#pragma unroll
            for (int q = 0; q < 8; ++q)
                epi(__bfloat162float(pp[q]), __bfloat162float(xp[q]), t, c0 + q, bt, ls1, beta1, alpha1, o5[q], o6[q]);
            reinterpret_cast<uint4*>(v5)[i] = r5;
            reinterpret_cast<uint4*>(v6)[i] = r6;
        }
    } else {
        for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x)
            epi(__bfloat162float(P[e]), __bfloat162float(x[e]), (int)((e / C) % T), (int)(e % C), bt, ls1, beta1,
                alpha1, v5[e], v6[e]);
    }
}

std::vector<torch::Tensor> resmlp_forward(torch::Tensor x, torch::Tensor alpha, torch::Tensor beta, torch::Tensor wt,
                                          torch::Tensor bt, torch::Tensor ls1, torch::Tensor alpha1,
                                          torch::Tensor beta1) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 3, "x: bfloat16 CUDA (B, T, C) expected");
    x = x.contiguous(); alpha = alpha.contiguous(); beta = beta.contiguous(); wt = wt.contiguous(); bt = bt.contiguous();
    ls1 = ls1.contiguous(); alpha1 = alpha1.contiguous(); beta1 = beta1.contiguous();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    TORCH_CHECK(wt.size(0) == T && wt.size(1) == T, "token-mixing weight must be (T, T)");
    auto v5 = torch::empty_like(x);
    auto v6 = torch::empty_like(x);
    if (B == 0) return {v5, v6};
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t total = x.numel();
    const bool vec = C % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
    const unsigned grid = (unsigned)std::min<int64_t>((total / (vec ? 8 : 1) + 255) / 256, sms * 16);
    bf16* v0 = (bf16*)v6.data_ptr();  // scratch: v6 is written by the epilogue after the GEMM has read v0
    affine_in<<<grid, 256, 0, stream>>>((const bf16*)x.data_ptr(), (const bf16*)alpha.data_ptr(),
                                        (const bf16*)beta.data_ptr(), v0, total, (int)C, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    auto P = torch::empty_like(x);
    // per image, column-major: P_b (C x T) = v0_b (C x T) * Wt^T (T x T)
    LtArgs a;
    a.ab_type = a.cd_type = CUDA_R_16BF;
    a.m = C; a.n = T; a.k = T;
    a.A = v0; a.lda = C; a.strideA = T * C;
    a.B = wt.data_ptr(); a.ldb = T; a.strideB = 0;
    a.D = P.data_ptr(); a.ldd = C; a.strideD = T * C;
    a.batch = (int)B;
    lt_matmul(a, x.device(), stream);
    epilogue<<<grid, 256, 0, stream>>>(
        (const bf16*)P.data_ptr(), (const bf16*)x.data_ptr(), (const bf16*)bt.data_ptr(), (const bf16*)ls1.data_ptr(),
        (const bf16*)beta1.data_ptr(), (const bf16*)alpha1.data_ptr(), (bf16*)v5.data_ptr(), (bf16*)v6.data_ptr(),
        total, (int)T, (int)C, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {v5, v6};
}
