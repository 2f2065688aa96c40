// Squeeze-excitation gate -> channel scale (output 1) -> 1x1 conv -> BN(eval) -> GELU (output 2), float16.
// Design: (1) a tiny kernel computes the gate s[n, c] = Hardsigmoid(W1 ReLU(x[n]) + b1) and folds the BatchNorm
// scale into the 1x1-conv weight (W2' = W2 * bn_scale[o], shift[o] as the bias); (2) one 16-byte-vector pass
// writes v3 = y * s; (3) cuBLASLt computes, per image, out = GELU(W2' v3 + shift) on tensor cores with the
// GELU_BIAS epilogue (tanh form of GELU, < 3e-4 from the erf form): the output is produced channels-last
// (N, H, W, Cout) so that the per-channel shift is cuBLASLt's per-row bias, and returned as the (N, Cout, H, W)
// permuted view (a strided tensor; no extra pass over it).
// Bytes (N = 32): y 19.3 MB read, v3 19.3 MB written, GEMM 19.3 MB read + 38.5 MB written = 96 MB
// -> about 30 us on an H200 (roofline_ms 0.016, compile_ms 0.089).
#include "lib.cuh"

typedef __half f16;

// blocks < N: the gate of image blockIdx.x; all blocks (grid-stride): the BN-folded conv weight and shift
__global__ void gate_and_fold(const f16* __restrict__ x, const f16* __restrict__ w1, const f16* __restrict__ b1,
                              f16* __restrict__ gate, int N, int Cin, int Cg, const f16* __restrict__ w2,
                              const f16* __restrict__ g, const f16* __restrict__ bb, const f16* __restrict__ m,
                              const f16* __restrict__ v, float eps, f16* __restrict__ w2f, f16* __restrict__ shift,
                              int Cout) {
    const int n = blockIdx.x;
    for (int c = threadIdx.x; n < N && c < Cg; c += blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < Cin; ++k) acc += __half2float(w1[c * Cin + k]) * fmaxf(__half2float(x[n * Cin + k]), 0.f);
        const float pre = __half2float(__float2half_rn(acc + __half2float(b1[c])));
        gate[n * Cg + c] = __float2half_rn(fminf(fmaxf(pre / 6.f + 0.5f, 0.f), 1.f));
    }
    {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < Cout * Cg; i += gridDim.x * blockDim.x) {
            const int o = i / Cg;
            const float s = __half2float(g[o]) * rsqrtf(__half2float(v[o]) + eps);
            w2f[i] = __float2half_rn(__half2float(w2[i]) * s);
        }
        for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < Cout; o += gridDim.x * blockDim.x) {
            const float s = __half2float(g[o]) * rsqrtf(__half2float(v[o]) + eps);
            shift[o] = __float2half_rn(__half2float(bb[o]) - __half2float(m[o]) * s);
        }
    }
}

// y (planes of HW) * gate[plane] -> out; 8 halves per step when HW % 8 == 0
__global__ void scale_planes(const f16* __restrict__ y, const f16* __restrict__ gate, f16* __restrict__ out,
                             int64_t total, int HW, bool vec) {
    if (vec) {
        const int64_t n8 = total / 8;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
            const float s = __half2float(gate[(i * 8) / HW]);
            uint4 raw = reinterpret_cast<const uint4*>(y)[i];
            __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float2 f = __half22float2(h[q]);
                h[q] = __floats2half2_rn(f.x * s, f.y * s);
            }
            reinterpret_cast<uint4*>(out)[i] = raw;
        }
    } else {
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
            out[i] = __float2half_rn(__half2float(y[i]) * __half2float(gate[i / HW]));
    }
}

std::vector<torch::Tensor> se_conv_bn_gelu(torch::Tensor x, torch::Tensor y, torch::Tensor w1, torch::Tensor b1,
                                           torch::Tensor w2, torch::Tensor g, torch::Tensor bb, torch::Tensor m,
                                           torch::Tensor v, double eps) {
    TORCH_CHECK(y.is_cuda() && y.scalar_type() == torch::kHalf && y.dim() == 4, "y: float16 CUDA NCHW expected");
    x = x.contiguous(); y = y.contiguous(); w1 = w1.contiguous(); b1 = b1.contiguous(); w2 = w2.contiguous();
    g = g.contiguous(); bb = bb.contiguous(); m = m.contiguous(); v = v.contiguous();
    const int64_t N = y.size(0), Cg = y.size(1), H = y.size(2), W = y.size(3), HW = H * W;
    const int64_t Cin = x.size(1), Cout = w2.size(0);
    TORCH_CHECK(w1.size(0) == Cg && w1.numel() == Cg * Cin && w2.numel() == Cout * Cg, "conv weight shapes");
    auto v3 = torch::empty_like(y);
    auto out = torch::empty({N, H, W, Cout}, y.options());  // channels-last storage
    if (N == 0) return {v3, out};
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    auto gate = torch::empty({N, Cg}, y.options());
    auto w2f = torch::empty({Cout, Cg}, y.options());
    auto shift = torch::empty({Cout}, y.options());
    gate_and_fold<<<(unsigned)std::max<int64_t>(N, 2 * sms), 256, 0, stream>>>(
        (const f16*)x.data_ptr(), (const f16*)w1.data_ptr(), (const f16*)b1.data_ptr(), (f16*)gate.data_ptr(), (int)N, (int)Cin,
        (int)Cg, (const f16*)w2.data_ptr(), (const f16*)g.data_ptr(), (const f16*)bb.data_ptr(),
        (const f16*)m.data_ptr(), (const f16*)v.data_ptr(), (float)eps, (f16*)w2f.data_ptr(), (f16*)shift.data_ptr(),
        (int)Cout);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const bool vec = HW % 8 == 0;
    const int64_t total = y.numel();
    scale_planes<<<(unsigned)std::min<int64_t>((total / (vec ? 8 : 1) + 255) / 256, sms * 16), 256, 0, stream>>>(
        (const f16*)y.data_ptr(), (const f16*)gate.data_ptr(), (f16*)v3.data_ptr(), total, (int)HW, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // per image, column-major: out (Cout x HW, i.e. channels-last rows) = W2' (Cout x Cg) * v3_n (Cg x HW), + shift, GELU
    LtArgs a;
    a.ab_type = a.cd_type = CUDA_R_16F;
    a.transa = true; a.transb = true;
    a.m = Cout; a.n = HW; a.k = Cg;
    a.A = w2f.data_ptr(); a.lda = Cg; a.strideA = 0;
    a.B = v3.data_ptr(); a.ldb = HW; a.strideB = Cg * HW;
    a.D = out.data_ptr(); a.ldd = Cout; a.strideD = Cout * HW;
    a.batch = (int)N;
    a.epilogue = CUBLASLT_EPILOGUE_GELU_BIAS; a.bias = shift.data_ptr();
    lt_matmul(a, y.device(), stream);
    return {v3, out};
}
