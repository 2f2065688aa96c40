// MLP-Mixer token mixing: y + (fc2(GELU(fc1(x^T))))^T, float32.
// Design: both transposes are fused into cuBLASLt operand layouts (no transposed copy is made).
//   GEMM 1 (per image, strided batch): H (C x 384, stored with row pitch 392) = x^T W1^T + b1, GELU, in the
//   cuBLASLt GELU_BIAS epilogue (tanh form of GELU; it differs from the erf form by < 5e-4).
//   GEMM 2 (per image): out (T x C, i.e. already transposed back) = y + H W2^T + b2, with y as cuBLASLt's C
//   operand (beta = 1) and b2 folded into the GEMM as an extra K column: H carries a column of ones at index 384
//   and W2 is extended to (T x 392) with b2 in that column (a tiny kernel builds it every call).
// TF32 tensor cores with fp32 accumulation (inputs rounded to 10-bit mantissas: ~1e-4 error here vs 1e-2 tolerance).
// Bytes (B = 64): x, y 38.5 MB each read, out 38.5 MB written, H 77 MB written and read; 14.8 GFLOP TF32
// -> about 0.1 ms on an H200 (roofline_ms 0.221, compile_ms 0.492).
#include "lib.cuh"

constexpr int KP = 8;  // extra columns of H: [ones, zeros...] so that the pitch stays a multiple of 8

__global__ void build_w2aug(const float* __restrict__ w2, const float* __restrict__ b2, float* __restrict__ w2a, int T,
                            int K, int Kp) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * Kp) return;
    const int t = i / Kp, j = i % Kp;
    w2a[i] = j < K ? w2[t * K + j] : (j == K ? b2[t] : 0.f);
}

__global__ void fill_tail(float* __restrict__ h, int64_t rows, int K, int Kp) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= rows * (Kp - K)) return;
    const int64_t r = i / (Kp - K);
    const int j = (int)(i % (Kp - K));
    h[r * Kp + K + j] = j == 0 ? 1.f : 0.f;
}

torch::Tensor mixer_forward(torch::Tensor x, torch::Tensor y, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2,
                            torch::Tensor b2) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 3, "x: float32 CUDA (B, T, C) expected");
    x = x.contiguous(); y = y.contiguous(); w1 = w1.contiguous(); b1 = b1.contiguous(); w2 = w2.contiguous();
    b2 = b2.contiguous();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = w1.size(0);
    TORCH_CHECK(w1.size(1) == T && w2.size(0) == T && w2.size(1) == K, "fc shapes");
    auto out = torch::empty_like(y);
    if (B == 0) return out;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int64_t Kp = ((K + 1 + KP - 1) / KP) * KP;
    auto h = torch::empty({B, C, Kp}, x.options());
    auto w2a = torch::empty({T, Kp}, x.options());
    build_w2aug<<<(unsigned)((T * Kp + 255) / 256), 256, 0, stream>>>(w2.data_ptr<float>(), b2.data_ptr<float>(),
                                                                      w2a.data_ptr<float>(), (int)T, (int)K, (int)Kp);
    const int64_t rows = B * C;
    fill_tail<<<(unsigned)((rows * (Kp - K) + 255) / 256), 256, 0, stream>>>(h.data_ptr<float>(), rows, (int)K, (int)Kp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // GEMM 1, column-major per image: H^T (K x C, ld Kp) = W1 (K x T) * x_b (T x C)
    LtArgs a;
    a.ab_type = a.cd_type = CUDA_R_32F;
    a.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    a.transa = true; a.transb = true;
    a.m = K; a.n = C; a.k = T;
    a.A = w1.data_ptr(); a.lda = T; a.strideA = 0;
    a.B = x.data_ptr(); a.ldb = C; a.strideB = T * C;
    a.D = h.data_ptr(); a.ldd = Kp; a.strideD = C * Kp;
    a.batch = (int)B;
    a.epilogue = CUBLASLT_EPILOGUE_GELU_BIAS; a.bias = b1.data_ptr();
    lt_matmul(a, x.device(), stream);
    // GEMM 2, column-major per image: out_b (C x T) = H_b (C x Kp) * W2aug^T (Kp x T) + y_b
    LtArgs c;
    c.ab_type = c.cd_type = CUDA_R_32F;
    c.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    c.transa = true; c.transb = false;
    c.m = C; c.n = T; c.k = Kp;
    c.A = h.data_ptr(); c.lda = Kp; c.strideA = C * Kp;
    c.B = w2a.data_ptr(); c.ldb = Kp; c.strideB = 0;
    c.C = y.data_ptr(); c.ldc = C; c.strideC = T * C;
    c.D = out.data_ptr(); c.ldd = C; c.strideD = T * C;
    c.beta = 1.f;
    c.batch = (int)B;
    lt_matmul(c, x.device(), stream);
    return out;
}
