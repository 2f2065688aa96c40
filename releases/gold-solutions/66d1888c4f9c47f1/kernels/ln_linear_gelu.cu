// LayerNorm(96) -> Linear(96 -> 384) -> GELU, float32 (torchvision swin_t MLP entry).
// Design: one warp per token normalises its row in registers (16-byte loads, two-pass statistics) and writes the
// GEMM operand once (9.6 MB); one cuBLASLt float32 GEMM (CUBLAS_COMPUTE_32F, no TF32) applies bias + GELU in its
// epilogue and writes the output (38.5 MB) once, so the 384-wide activation is never re-read.
// Note: cuBLASLt's GELU epilogue is the tanh form; |gelu_tanh - gelu_erf| <= 4.8e-4 everywhere, 20x below the
// float32 tolerance (1e-2).
// Bytes ~58 MB + 1.85 GFLOP float32: predicted ~0.045 ms vs roofline 0.028 ms and torch.compile 0.085 ms.
#include "registry.h"
#include "gold_common.cuh"

// fallback when cuBLASLt offers no GELU epilogue for float32: exact erf-GELU in place, float4 vectors
__global__ void __launch_bounds__(256) gelu_inplace_kernel(float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = y[i];
        v.x = 0.5f * v.x * (1.f + erff(v.x * 0.70710678118654752f));
        v.y = 0.5f * v.y * (1.f + erff(v.y * 0.70710678118654752f));
        v.z = 0.5f * v.z * (1.f + erff(v.z * 0.70710678118654752f));
        v.w = 0.5f * v.w * (1.f + erff(v.w * 0.70710678118654752f));
        y[i] = v;
    }
}

torch::Tensor ln_linear_gelu(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps, torch::Tensor lw,
                             torch::Tensor lb) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "ln_linear_gelu: float32 CUDA tensor expected");
    auto xc = x.contiguous();
    const int64_t C = xc.size(-1), rows = xc.numel() / C;
    auto lwc = lw.contiguous(), lbc = lb.contiguous();
    const int64_t N = lwc.size(0);
    TORCH_CHECK(lwc.size(1) == C, "ln_linear_gelu: linear weight shape");
    auto xn = torch::empty({rows, C}, xc.options());
    auto sizes = xc.sizes().vec();
    sizes.back() = N;
    auto out = torch::empty(sizes, xc.options());
    if (rows == 0) return out;
    gold::ln_rows<float, 4, 1, false>(xc.data_ptr(), nullptr, nullptr, w.contiguous().data_ptr(),
                                      b.contiguous().data_ptr(), xn.data_ptr(), rows, (int)C, (float)eps);
    if (!gold::lt_linear_try(xn.data_ptr(), lwc.data_ptr(), lbc.data_ptr(), nullptr, out.data_ptr(), rows, N, C,
                             CUDA_R_32F, CUBLASLT_EPILOGUE_GELU_BIAS, 0.f, xc.device())) {
        TORCH_CHECK(N % 4 == 0, "ln_linear_gelu: N must be a multiple of 4");
        gold::lt_linear(xn.data_ptr(), lwc.data_ptr(), lbc.data_ptr(), nullptr, out.data_ptr(), rows, N, C, CUDA_R_32F,
                        CUBLASLT_EPILOGUE_BIAS, 0.f, xc.device());
        const int64_t n4 = rows * N / 4;
        const int64_t blocks = std::min<int64_t>((n4 + 255) / 256, 132 * 16);
        gelu_inplace_kernel<<<(unsigned)blocks, 256, 0, at::cuda::getCurrentCUDAStream().stream()>>>(
            reinterpret_cast<float4*>(out.data_ptr()), n4);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
OPFORGE_EXPORT(ln_linear_gelu, "GELU(Linear(LayerNorm(x))), float32, LayerNorm width <= 128");
