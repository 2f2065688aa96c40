// out = dense(merge_heads(softmax(x / s) @ y)) + z for x [B, H, N, L] (fp32), y [B, H, L, 64], z [B, N, H * 64],
// dense = Linear(H * 64, Cout). PVT efficient self-attention tail.
// Design: (1) one thread block per (batch, head, tile of 64 query rows): scores and values staged in shared
// memory with 16-byte loads, one thread per row does the softmax (max, exp2, sum), P @ V on a 4 x 4 register
// tile per thread, result stored straight into the merged-head layout A [B, N, H * 64] (the permute +
// contiguous + view is only the store index). (2) cuBLASLt: out = A @ W^T + bias + z in one GEMM, bias by the
// BIAS epilogue and z as the C operand (beta = 1), float32 accumulate (no TF32).
// Bytes (public shape): x 5.1 MB + y 6.6 MB + z 6.6 MB + W 1 MB read, A 6.6 MB written and read, out 6.6 MB
// -> ~8 us of traffic; the fp32 GEMM (1.68 GFLOP) dominates (~30 us). roofline_ms 0.0275, compile_ms 0.080;
// predicted ~40 us.
#include "registry.h"
#include "lt_linear.cuh"

constexpr int TN = 64;   // query rows per block
constexpr int DH = 64;   // head dim
constexpr int NT = 256;

__device__ __forceinline__ void load_flat(const float* __restrict__ src, float* dst, int n) {
    int start = 0;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        const int nv = n / 4;
        constexpr int U = 4;  // loads in flight per thread
        for (int v0 = threadIdx.x; v0 < nv; v0 += NT * U) {
            float4 r[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (v0 + u * NT < nv) r[u] = __ldcs(reinterpret_cast<const float4*>(src) + v0 + u * NT);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (v0 + u * NT < nv) reinterpret_cast<float4*>(dst)[v0 + u * NT] = r[u];
        }
        start = nv * 4;
    }
    for (int i = start + threadIdx.x; i < n; i += NT) dst[i] = src[i];
}

__global__ void __launch_bounds__(NT) attn_merge_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ A,
                                                        int H, int N, int L, int tiles, float k_log2) {
    extern __shared__ float4 smem4[];
    const int Lp = (L + 3) & ~3;               // Xs row stride, 16-byte aligned rows
    float* Xs = reinterpret_cast<float*>(smem4);  // [TN][L] raw scores (contiguous copy)
    float* Pt = Xs + TN * Lp;                  // [L][TN]
    float* Ys = Pt + L * TN;                   // [L][DH]
    const int bh = blockIdx.x / tiles;
    const int n0 = (blockIdx.x - bh * tiles) * TN;
    const int rows = min(TN, N - n0);
    const int tid = threadIdx.x;
    load_flat(x + ((int64_t)bh * N + n0) * L, Xs, rows * L);
    load_flat(y + (int64_t)bh * L * DH, Ys, L * DH);
    __syncthreads();
    for (int n = tid; n < TN; n += NT) {
        float* pcol = Pt + n;
        if (n < rows) {
            const float* xr = Xs + n * L;
            float m = -INFINITY;
            for (int k = 0; k < L; ++k) m = fmaxf(m, xr[k]);
            float s = 0.f;
            for (int k = 0; k < L; ++k) { float e = exp2f((xr[k] - m) * k_log2); pcol[k * TN] = e; s += e; }
            const float inv = 1.f / s;
            for (int k = 0; k < L; ++k) pcol[k * TN] *= inv;
        } else {
            for (int k = 0; k < L; ++k) pcol[k * TN] = 0.f;
        }
    }
    __syncthreads();
    const int rg = tid >> 4, cg = tid & 15;
    const float* pp = Pt + rg * 4;
    const float* yp = Ys + cg * 4;
    float acc[4][4] = {};
    for (int k = 0; k < L; ++k) {
        const float4 p = *reinterpret_cast<const float4*>(pp + k * TN);
        const float4 v = *reinterpret_cast<const float4*>(yp + k * DH);
        const float pr[4] = {p.x, p.y, p.z, p.w}, vr[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(pr[i], vr[j], acc[i][j]);
    }
    const int b = bh / H, h = bh - b * H;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int n = rg * 4 + i;
        if (n < rows)
            *reinterpret_cast<float4*>(A + (((int64_t)b * N + n0 + n) * H + h) * DH + cg * 4) =
                make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
}

// x [B, H, N, L], y [B, H, L, 64], z [B, N, H * 64], weight [Cout, H * 64], bias [Cout]; float32.
torch::Tensor attn_dense(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4 && y.dim() == 4 && z.dim() == 3, "attn_dense: x [B,H,N,L], y [B,H,L,D], z [B,N,C] CUDA");
    for (auto* t : {&x, &y, &z, &weight, &bias}) TORCH_CHECK(t->scalar_type() == torch::kFloat, "attn_dense: float32 expected");
    const int B = x.size(0), H = x.size(1), N = x.size(2), L = x.size(3);
    TORCH_CHECK(y.size(0) == B && y.size(1) == H && y.size(2) == L && y.size(3) == DH, "attn_dense: y must be [B, H, L, 64]");
    const int C = H * DH, Co = weight.size(0);
    TORCH_CHECK(weight.size(1) == C && bias.numel() == Co && z.size(0) == B && z.size(1) == N && z.size(2) == Co,
                "attn_dense: weight [Cout, H*64], bias [Cout], z [B, N, Cout] expected");
    auto xc = x.contiguous(), yc = y.contiguous(), zc = z.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
    auto out = torch::empty({B, N, Co}, x.options());
    if (B == 0 || N == 0) return out;
    TORCH_CHECK(L > 0, "attn_dense: empty key axis");
    auto A = torch::empty({B, N, C}, x.options());
    const int tiles = (N + TN - 1) / TN;
    const size_t smem = sizeof(float) * ((size_t)TN * ((L + 3) & ~3) + (size_t)L * TN + (size_t)L * DH);
    TORCH_CHECK(smem <= 220 * 1024, "attn_dense: L too large (", smem, " bytes of shared memory)");
    cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
    cudaFuncSetAttribute(attn_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_merge_kernel<<<(unsigned)((int64_t)B * H * tiles), NT, smem, st>>>(xc.data_ptr<float>(), yc.data_ptr<float>(), A.data_ptr<float>(),
                                                                             H, N, L, tiles, (float)(1.4426950408889634 / scale));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    ltlin::linear(A.data_ptr(), wc.data_ptr(), bc.data_ptr(), zc.data_ptr(), out.data_ptr(), (int64_t)B * N, Co, C, CUDA_R_32F, st,
                  x.options());
    return out;
}
OPFORGE_EXPORT(attn_dense, "dense(merge_heads(softmax(x / scale) @ y)) + z: fused softmax + PV kernel, cuBLASLt GEMM with bias and residual");
