// out = proj(merge_heads(softmax(x / s) @ y)) + z for x [B, H, N, L], y [B, H, L, D], z [B, N, C], C = H * D = 64,
// proj = Linear(C, 64). PVT-v2 spatial-reduction attention after the scores.
// Design: one thread block per (batch, tile of 64 query rows), 256 threads, everything in shared memory:
//   1. softmax straight from global memory: one warp per (head, row) (rows are contiguous in x, so the warp's
//      loads are coalesced), each warp's 16 rows loaded before any is reduced (loads in flight), max / exp2 /
//      sum by shuffles, P^T [H][L][64 + 4] written to shared memory;
//   2. y[b] (H x L x D) and W (64 x 64, odd row stride) are staged in shared memory with 16-byte loads;
//   3. P @ y on a 4 x 4 register tile per thread (64 rows x 64 merged columns; the head split / merge transpose
//      is only an index: merged column c = h * D + d), result O^T [C][64] in shared memory;
//   4. O @ W^T on a 4 x 4 register tile per thread, + bias + z, written with vector stores.
// Only x, y, z and the output touch DRAM. float32 math throughout.
// Bytes (public shape, fp32): x 78.7 MB + y 3.2 MB + z 51.4 MB read, out 51.4 MB written = 185 MB -> 38 us at
// 4.8 TB/s; 1.4 GFMA on the CUDA cores (~22 us at peak). roofline_ms 0.0433, compile_ms 0.271 (fp32) /
// 0.0192, 0.186 (fp16); predicted ~60-70 us (fp32), ~50 us (fp16).
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

constexpr int TN = 64;     // query rows per block
constexpr int CM = 64;     // merged channels (H * D) = proj in_features
constexpr int CO = 64;     // proj out_features
constexpr int NT = 256;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// n contiguous elements of src -> float dst[0..n), 16-byte loads when src is aligned, U loads in flight per thread.
template <typename T>
__device__ __forceinline__ void load_flat(const T* __restrict__ src, float* dst, int n) {
    constexpr int V = 16 / sizeof(T);
    constexpr int U = 4;
    int start = 0;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        const int nv = n / V;
        for (int v0 = threadIdx.x; v0 < nv; v0 += NT * U) {
            uint4 raw[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (v0 + u * NT < nv) raw[u] = __ldg(reinterpret_cast<const uint4*>(src) + v0 + u * NT);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int v = v0 + u * NT;
                if (v < nv) {
                    const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
                    for (int w = 0; w < V; w += 4)  // dst offsets are multiples of 4 floats
                        *reinterpret_cast<float4*>(dst + v * V + w) = make_float4(to_f(e[w]), to_f(e[w + 1]), to_f(e[w + 2]), to_f(e[w + 3]));
                }
            }
        }
        start = nv * V;
    }
    for (int i = start + threadIdx.x; i < n; i += NT) dst[i] = to_f(src[i]);
}

template <typename T> __device__ __forceinline__ void load4(const T* p, float* f) {
    if constexpr (sizeof(T) == 4) {
        float4 v = __ldcs(reinterpret_cast<const float4*>(p));
        f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
    } else {
        uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int u = 0; u < 4; ++u) f[u] = to_f(e[u]);
    }
}
template <typename T> __device__ __forceinline__ void store4(T* p, const float* f) {
    if constexpr (sizeof(T) == 4) {
        __stcs(reinterpret_cast<float4*>(p), make_float4(f[0], f[1], f[2], f[3]));
    } else {
        uint2 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int u = 0; u < 4; ++u) e[u] = from_f<T>(f[u]);
        __stcs(reinterpret_cast<uint2*>(p), raw);
    }
}

constexpr int TNP = TN + 4;   // P^T row stride (16-byte aligned rows)
constexpr int RPW = 2 * TN / (NT / 32);  // softmax rows per warp for H = 2 (the loop handles any H)

template <typename T>
__global__ void __launch_bounds__(NT) attn_proj_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ z,
                                                       const T* __restrict__ W, const T* __restrict__ bias, T* __restrict__ out,
                                                       int H, int N, int L, int D, int tiles, float k_log2, int alias_o) {
    extern __shared__ float4 smem4[];
    float* Pt = reinterpret_cast<float*>(smem4);     // [H][L][TNP]  probabilities, transposed
    float* Ys = Pt + H * L * TNP;                    // [H][L][D]
    float* Ws = Ys + H * L * D;                      // [CO][CM + 1] W (odd stride: conflict-free column reads)
    float* Ot = alias_o ? Pt : Ws + ((CO * (CM + 1) + 3) & ~3);   // [CM][TN] (P @ y)^T, reuses Pt when it fits
    const int b = blockIdx.x / tiles;
    const int n0 = (blockIdx.x - b * tiles) * TN;
    const int rows = min(TN, N - n0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // softmax straight from global: warp per (head, row), rows contiguous in x; all of a batch of rows' loads first
    {
        const T* xb = x + (int64_t)b * H * N * L;
        const int nr = H * TN;
        for (int r0 = warp; r0 < nr; r0 += (NT / 32) * RPW) {
            float v[RPW][2];
#pragma unroll
            for (int i = 0; i < RPW; ++i) {
                const int r = r0 + i * (NT / 32);
                const int h = r / TN, n = r - h * TN;
                const bool ok = r < nr && n < rows;
                const T* xr = xb + ((int64_t)h * N + n0 + n) * L;
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const int k = lane + 32 * t;
                    v[i][t] = (ok && k < L) ? to_f(xr[k]) : -INFINITY;
                }
            }
#pragma unroll
            for (int i = 0; i < RPW; ++i) {
                const int r = r0 + i * (NT / 32);
                if (r >= nr) break;
                const int h = r / TN, n = r - h * TN;
                float* pcol = Pt + h * L * TNP + n;
                if (n >= rows) {
                    for (int k = lane; k < L; k += 32) pcol[k * TNP] = 0.f;
                    continue;
                }
                float m = fmaxf(v[i][0], v[i][1]);
#pragma unroll
                for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                const float e0 = exp2f((v[i][0] - m) * k_log2), e1 = exp2f((v[i][1] - m) * k_log2);
                float s = e0 + e1;
#pragma unroll
                for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                const float inv = 1.f / s;
                if (lane < L) pcol[lane * TNP] = e0 * inv;
                if (lane + 32 < L) pcol[(lane + 32) * TNP] = e1 * inv;
            }
        }
    }
    load_flat(y + (int64_t)b * H * L * D, Ys, H * L * D);
    {
        constexpr int V = 16 / sizeof(T);
        for (int i = tid; i < CM * CO / V; i += NT) {
            uint4 raw = __ldg(reinterpret_cast<const uint4*>(W) + i);
            const T* e = reinterpret_cast<const T*>(&raw);
            const int j = (i * V) / CM, c = (i * V) - j * CM;
#pragma unroll
            for (int u = 0; u < V; ++u) Ws[j * (CM + 1) + c + u] = to_f(e[u]);
        }
    }
    __syncthreads();

    const int rg = tid >> 4, cg = tid & 15;   // rows rg*4..+3, columns cg*4..+3
    {
        const int c = cg * 4, h = c / D, d = c - h * D;
        const float* pp = Pt + h * L * TNP + rg * 4;
        const float* yp = Ys + h * L * D + d;
        float acc[4][4] = {};
#pragma unroll 7
        for (int k = 0; k < L; ++k) {
            const float4 p = *reinterpret_cast<const float4*>(pp + k * TNP);
            const float4 v = *reinterpret_cast<const float4*>(yp + k * D);
            const float pr[4] = {p.x, p.y, p.z, p.w}, vr[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(pr[i], vr[j], acc[i][j]);
        }
        if (alias_o) __syncthreads();  // Ot overwrites Pt: every warp is done reading it
#pragma unroll
        for (int j = 0; j < 4; ++j)
            *reinterpret_cast<float4*>(Ot + (c + j) * TN + rg * 4) = make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
    }
    __syncthreads();
    {
        const int j0 = cg * 4;
        float acc[4][4] = {};
#pragma unroll 8
        for (int c = 0; c < CM; ++c) {
            const float4 o = *reinterpret_cast<const float4*>(Ot + c * TN + rg * 4);
            const float orr[4] = {o.x, o.y, o.z, o.w};
            float wr[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) wr[j] = Ws[(j0 + j) * (CM + 1) + c];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(orr[i], wr[j], acc[i][j]);
        }
        float bj[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) bj[j] = to_f(bias[j0 + j]);
        float zr[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (rg * 4 + i < rows) load4(z + ((int64_t)b * N + n0 + rg * 4 + i) * CO + j0, zr[i]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = rg * 4 + i;
            if (n < rows) {
                float r[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) r[j] = acc[i][j] + bj[j] + zr[i][j];
                store4(out + ((int64_t)b * N + n0 + n) * CO + j0, r);
            }
        }
    }
}

// x [B, H, N, L] scores, y [B, H, L, D] values, z [B, N, 64] residual, weight [64, H * D], bias [64]; H * D == 64.
torch::Tensor attn_proj(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4 && y.dim() == 4 && z.dim() == 3, "attn_proj: x [B,H,N,L], y [B,H,L,D], z [B,N,C] CUDA");
    const int B = x.size(0), H = x.size(1), N = x.size(2), L = x.size(3), D = y.size(3);
    TORCH_CHECK(y.size(0) == B && y.size(1) == H && y.size(2) == L, "attn_proj: y does not match x");
    TORCH_CHECK(H * D == CM && D % 4 == 0 && weight.size(0) == CO && weight.size(1) == CM && bias.numel() == CO,
                "attn_proj: built for H * D = 64 (D % 4 == 0) and Linear(64, 64)");
    TORCH_CHECK(z.size(0) == B && z.size(1) == N && z.size(2) == CO, "attn_proj: z must be [B, N, 64]");
    auto st_ = x.scalar_type();
    for (auto* t : {&y, &z, &weight, &bias}) TORCH_CHECK(t->scalar_type() == st_, "attn_proj: dtypes differ");
    auto xc = x.contiguous(), yc = y.contiguous(), zc = z.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
    auto out = torch::empty({B, N, CO}, x.options());
    if (B == 0 || N == 0) return out;
    TORCH_CHECK(L > 0 && L <= 64, "attn_proj: built for key length 1..64, got ", L);
    const int tiles = (N + TN - 1) / TN;
    const int alias_o = H * L * TNP >= CM * TN;
    const size_t smem = sizeof(float) * ((size_t)H * L * TNP + (size_t)H * L * D + ((CO * (CM + 1) + 3) & ~3) + (alias_o ? 0 : CM * TN));
    TORCH_CHECK(smem <= 220 * 1024, "attn_proj: L too large for one block (", smem, " bytes of shared memory)");
    const float k_log2 = (float)(1.4426950408889634 / scale);
    cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
    auto launch = [&](auto* dummy) {
        using T = std::remove_pointer_t<decltype(dummy)>;
        auto kern = attn_proj_kernel<T>;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        auto p = [](torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
        kern<<<(unsigned)(B * tiles), NT, smem, st>>>(p(xc), p(yc), p(zc), p(wc), p(bc), p(out), H, N, L, D, tiles, k_log2, alias_o);
    };
    if (st_ == torch::kFloat) launch((float*)nullptr);
    else if (st_ == torch::kHalf) launch((__half*)nullptr);
    else if (st_ == torch::kBFloat16) launch((__nv_bfloat16*)nullptr);
    else TORCH_CHECK(false, "attn_proj: float32 / float16 / bfloat16 expected");
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(attn_proj, "proj(merge_heads(softmax(x / scale) @ y)) + z in one kernel");
