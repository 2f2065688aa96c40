// Flint shared-expert tail: out = z + (y + x @ Wd^T), bfloat16.
// Design: the GEMM (30000 x 2048 x 1024, 126 GFLOP) is compute-bound, the two residual adds memory-bound.
// The rows are split into 8 chunks: cuBLASLt computes v0 = x Wd^T of chunk i (bf16, rounded as the reference's
// Linear output) on the current stream, and a side stream finishes chunk i with one 16-byte-vector pass
// out = bf16(z + bf16(y + v0)) - the reference's own rounding order - while the GEMM of chunk i + 1 runs; the
// pass gets a quarter of the SMs' worth of blocks so that the GEMM keeps the rest (a design estimate, not tuned).
// Forks / joins are event record + wait (CUDA-graph safe); only the last chunk's pass is not hidden.
// Bytes: x 61 MB, v0 123 MB written + read, y + z 246 MB read, out 123 MB -> about 0.2 ms on an H200
// (GEMM-bound; roofline_ms 0.127, eager_ms 0.349, compile_ms 0.291).
#include "lib.cuh"
#include "side.cuh"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint4 residual2_vec(uint4 a, uint4 b, uint4 c) {
    uint4 r;
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
    const __nv_bfloat162* c2 = reinterpret_cast<const __nv_bfloat162*>(&c);
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float2 fa = __bfloat1622float2(a2[q]), fb = __bfloat1622float2(b2[q]), fc = __bfloat1622float2(c2[q]);
        const float2 t = __bfloat1622float2(__floats2bfloat162_rn(fb.x + fa.x, fb.y + fa.y));
        r2[q] = __floats2bfloat162_rn(fc.x + t.x, fc.y + t.y);
    }
    return r;
}

// out = bf16(z + bf16(y + v0)), n8 vectors of 8 values, two vectors per thread step (6 loads in flight)
__global__ void __launch_bounds__(512) residual2(const uint4* __restrict__ v0, const uint4* __restrict__ y,
                                                 const uint4* __restrict__ z, uint4* __restrict__ out, int64_t n8) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += 2 * stride) {
        const int64_t i2 = i + stride;
        const uint4 a = v0[i], b = y[i], c = z[i];
        uint4 a1 = a, b1 = b, c1 = c;
        if (i2 < n8) { a1 = v0[i2]; b1 = y[i2]; c1 = z[i2]; }
        out[i] = residual2_vec(a, b, c);
        if (i2 < n8) out[i2] = residual2_vec(a1, b1, c1);
    }
}

torch::Tensor shared_expert_residual_forward(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor wd) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2, "x: bfloat16 CUDA (M, K) expected");
    x = x.contiguous(); y = y.contiguous(); z = z.contiguous(); wd = wd.contiguous();
    const int64_t M = x.size(0), K = x.size(1), F = wd.size(0);
    TORCH_CHECK(wd.size(1) == K && y.numel() == M * F && z.numel() == M * F, "shapes");
    TORCH_CHECK(K % 8 == 0 && F % 8 == 0, "K and F must be multiples of 8");
    auto out = torch::empty(z.sizes(), z.options());
    if (M == 0) return out;
    cudaStream_t main = at::cuda::getCurrentCUDAStream();
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    SideStream& side = side_stream();
    auto v0 = torch::empty({M, F}, x.options());
    const int chunks = (int)std::max<int64_t>(1, std::min<int64_t>(8, M / 1024));
    const int64_t rows = ((M + chunks - 1) / chunks + 7) / 8 * 8;
    int slot = 0;
    for (int64_t r0 = 0; r0 < M; r0 += rows, ++slot) {
        const int64_t r = std::min(rows, M - r0);
        const int64_t n8 = r * F / 8, off = r0 * F;
        // column-major: v0^T chunk (F x r) = Wd (F x K) * x^T chunk (K x r)
        LtArgs a;
        a.ab_type = a.cd_type = CUDA_R_16BF;
        a.transa = true; a.m = F; a.n = r; a.k = K;
        a.A = wd.data_ptr(); a.lda = K;
        a.B = (const bf16*)x.data_ptr() + r0 * K; a.ldb = K;
        a.D = (bf16*)v0.data_ptr() + off; a.ldd = F;
        lt_matmul(a, x.device(), main);
        stream_wait(side.stream, main, slot);  // the side stream finishes this chunk beside the next GEMM
        residual2<<<(unsigned)std::max<int64_t>(1, std::min<int64_t>((n8 + 511) / 512, sms / 4)), 512, 0, side.stream>>>(
            (const uint4*)((const bf16*)v0.data_ptr() + off), (const uint4*)((const bf16*)y.data_ptr() + off),
            (const uint4*)((const bf16*)z.data_ptr() + off), (uint4*)((bf16*)out.data_ptr() + off), n8);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    stream_wait(main, side.stream, 15);  // join
    return out;
}
