// Attention with per-head sink logits (FlintAttention): for each (batch, head)
//   S = (x @ y) * scale + mask,  P = softmax(cat(S, sink_h), -1)[..., :-1] -> bf16,  out = P @ z.
// x [B, H, Lq, Dk] and y [B, H, Dk, Lk] are float32 (the reference does this GEMM in float32), z [B, H, Lk, Dv],
// mask [B | 1, H | 1, Lq, Lk] and sinks [H] are bfloat16, out [B, H, Lq, Dv] bfloat16.
// Design: one thread block (8 warps) per (batch, head), fully in shared memory, on the tensor cores:
//   1. x, y, z tiles loaded with 16-byte loads into padded shared tiles (zero padding to multiples of 16);
//   2. S = x @ y with wmma TF32 m16n16k8 in the 3xTF32 split (hi / lo parts, three MMAs: ~float32 accuracy;
//      plain TF32 reached 0.32 of the bf16 tolerance in a float64 emulation, 3xTF32 matches float32),
//      float32 accumulate, each warp keeps one column of tiles in registers;
//   3. one warp per row: scale, mask add, the sink joins the max and the denominator but not the output,
//      probabilities rounded to bf16 exactly as the reference's .to(bfloat16);
//   4. out = P @ z with wmma bf16 m16n16k16 (exact products, float32 accumulate), staged through shared
//      memory and stored with 16-byte stores.
// Bytes (public shape): x 26.2 MB + y 26.2 MB + z 13.1 MB + mask 0.3 MB read, out 13.1 MB written = 79 MB
// -> 16 us at 4.8 TB/s (roofline_ms 0.0209, compile_ms 0.115); predicted ~30-35 us.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

constexpr int NW = 8;          // warps per block
constexpr int NT = NW * 32;
constexpr int MAXT = 8;        // max 16-row tiles of queries / keys per head (Lq, Lk <= 128)

struct Geo {
    int Lq, Lk, Dk, Dv, LqP, LkP, ldq, ldk, lds, ldp, ldv, ldo;
    size_t r1, r2, r3;  // byte sizes of the three shared regions
};

__device__ __forceinline__ void copy_rows_f32(const float* __restrict__ src, float* dst, int rows, int cols, int ld) {
    // rows x cols contiguous (cols % 4 == 0, src 16-byte aligned) -> dst with row stride ld
    const int c4 = cols >> 2, n4 = rows * c4;
    constexpr int U = 8;  // loads in flight per thread
    for (int i0 = threadIdx.x; i0 < n4; i0 += NT * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i0 + u * NT < n4) v[u] = __ldcs(reinterpret_cast<const float4*>(src) + i0 + u * NT);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * NT;
            if (i < n4) {
                const int r = i / c4, c = (i - r * c4) * 4;
                *reinterpret_cast<float4*>(dst + r * ld + c) = v[u];
            }
        }
    }
}

__global__ void __launch_bounds__(NT) sink_attn_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                                       const __nv_bfloat16* __restrict__ mask, const __nv_bfloat16* __restrict__ sinks,
                                                       const __nv_bfloat16* __restrict__ z, __nv_bfloat16* __restrict__ out, Geo g, int H,
                                                       int64_t mask_sb, int64_t mask_sh, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    float* Qs = reinterpret_cast<float*>(smem);                                  // [LqP][ldq]   region 1
    __nv_bfloat16* Ps = reinterpret_cast<__nv_bfloat16*>(smem);                  // [LqP][ldp]   region 1 (after S)
    float* Ks = reinterpret_cast<float*>(smem + g.r1);                           // [Dk][ldk]    region 2
    float* Ss = Ks;                                                              // [LqP][lds]   region 2 (after QK)
    float* Os = Ks;                                                              // [LqP][ldo]   region 2 (after softmax)
    __nv_bfloat16* Vs = reinterpret_cast<__nv_bfloat16*>(smem + g.r1 + g.r2);   // [LkP][ldv]   region 3
    const int64_t bh = blockIdx.x;
    const int b = (int)(bh / H), h = (int)(bh - (int64_t)b * H);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    copy_rows_f32(x + bh * g.Lq * g.Dk, Qs, g.Lq, g.Dk, g.ldq);
    copy_rows_f32(y + bh * g.Dk * g.Lk, Ks, g.Dk, g.Lk, g.ldk);
    {
        const int c8 = g.Dv >> 3, n8 = g.Lk * c8;
        const uint4* zs = reinterpret_cast<const uint4*>(z + bh * g.Lk * g.Dv);
        constexpr int U = 8;
        for (int i0 = tid; i0 < n8; i0 += NT * U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i0 + u * NT < n8) v[u] = __ldcs(zs + i0 + u * NT);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * NT;
                if (i < n8) {
                    const int r = i / c8, c = (i - r * c8) * 8;
                    *reinterpret_cast<uint4*>(Vs + r * g.ldv + c) = v[u];
                }
            }
        }
    }
    // zero padding: query rows Lq..LqP, key columns Lk..LkP of y, value rows Lk..LkP
    for (int i = tid; i < (g.LqP - g.Lq) * g.Dk; i += NT) Qs[(g.Lq + i / g.Dk) * g.ldq + i % g.Dk] = 0.f;
    for (int i = tid; i < g.Dk * (g.LkP - g.Lk); i += NT) {
        const int w = g.LkP - g.Lk;
        Ks[(i / w) * g.ldk + g.Lk + i % w] = 0.f;
    }
    for (int i = tid; i < (g.LkP - g.Lk) * g.Dv; i += NT) Vs[(g.Lk + i / g.Dv) * g.ldv + i % g.Dv] = __float2bfloat16(0.f);
    __syncthreads();

    // S = Q K on TF32 tensor cores: warp w owns key-column tiles w, w + NW, ...; all query-row tiles.
    const int RT = g.LqP / 16, CT = g.LkP / 16;
    for (int ct0 = 0; ct0 < CT; ct0 += NW) {
        const int ct = ct0 + warp;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[MAXT];
        if (ct < CT) {
#pragma unroll
            for (int i = 0; i < MAXT; ++i) wmma::fill_fragment(acc[i], 0.f);
            for (int k = 0; k < g.Dk; k += 8) {
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb, fbs;
                wmma::load_matrix_sync(fb, Ks + k * g.ldk + ct * 16, g.ldk);
#pragma unroll
                for (int t = 0; t < fb.num_elements; ++t) {
                    const float v = fb.x[t], big = wmma::__float_to_tf32(v);
                    fb.x[t] = big;
                    fbs.x[t] = wmma::__float_to_tf32(v - big);
                }
#pragma unroll
                for (int i = 0; i < MAXT; ++i) {
                    if (i < RT) {
                        wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa, fas;
                        wmma::load_matrix_sync(fa, Qs + i * 16 * g.ldq + k, g.ldq);
#pragma unroll
                        for (int t = 0; t < fa.num_elements; ++t) {
                            const float v = fa.x[t], big = wmma::__float_to_tf32(v);
                            fa.x[t] = big;
                            fas.x[t] = wmma::__float_to_tf32(v - big);
                        }
                        // 3xTF32: hi*hi + lo*hi + hi*lo recovers ~float32 accuracy of the reference's GEMM
                        wmma::mma_sync(acc[i], fas, fb, acc[i]);
                        wmma::mma_sync(acc[i], fa, fbs, acc[i]);
                        wmma::mma_sync(acc[i], fa, fb, acc[i]);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done reading K before S overwrites it
        if (ct < CT) {
#pragma unroll
            for (int i = 0; i < MAXT; ++i)
                if (i < RT) wmma::store_matrix_sync(Ss + i * 16 * g.lds + ct * 16, acc[i], g.lds, wmma::mem_row_major);
        }
    }
    __syncthreads();

    // softmax with the sink, one warp per query row; P rounded to bf16, padding zero.
    const float sink = __bfloat162float(sinks[h]);
    const __nv_bfloat16* mrow0 = mask + (int64_t)b * mask_sb + (int64_t)h * mask_sh;
    for (int r = warp; r < g.LqP; r += NW) {
        __nv_bfloat16* prow = Ps + r * g.ldp;
        if (r >= g.Lq) {
            for (int j = lane; j < g.LkP; j += 32) prow[j] = __float2bfloat16(0.f);
            continue;
        }
        const float* srow = Ss + r * g.lds;
        const __nv_bfloat16* mrow = mrow0 + (int64_t)r * g.Lk;
        float l[MAXT * 16 / 32];
        float m = sink;
#pragma unroll
        for (int t = 0; t < MAXT * 16 / 32; ++t) {
            const int j = lane + 32 * t;
            l[t] = -INFINITY;
            if (j < g.Lk) { l[t] = srow[j] * scale + __bfloat162float(mrow[j]); m = fmaxf(m, l[t]); }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
#pragma unroll
        for (int t = 0; t < MAXT * 16 / 32; ++t) {
            const int j = lane + 32 * t;
            l[t] = j < g.Lk ? __expf(l[t] - m) : 0.f;
            s += l[t];
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float inv = 1.f / (s + __expf(sink - m));
#pragma unroll
        for (int t = 0; t < MAXT * 16 / 32; ++t) {
            const int j = lane + 32 * t;
            if (j < g.LkP) prow[j] = __float2bfloat16(l[t] * inv);
        }
    }
    __syncthreads();

    // O = P V on bf16 tensor cores: warp w owns value-column tiles w, w + NW, ...
    const int VT = g.Dv / 16;
    for (int vt = warp; vt < VT; vt += NW) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MAXT];
#pragma unroll
        for (int i = 0; i < MAXT; ++i) wmma::fill_fragment(acc[i], 0.f);
        for (int k = 0; k < g.LkP; k += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, Vs + k * g.ldv + vt * 16, g.ldv);
#pragma unroll
            for (int i = 0; i < MAXT; ++i) {
                if (i < RT) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                    wmma::load_matrix_sync(fa, Ps + i * 16 * g.ldp + k, g.ldp);
                    wmma::mma_sync(acc[i], fa, fb, acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < MAXT; ++i)
            if (i < RT) wmma::store_matrix_sync(Os + i * 16 * g.ldo + vt * 16, acc[i], g.ldo, wmma::mem_row_major);
    }
    __syncthreads();
    {
        const int c8 = g.Dv >> 3, n8 = g.Lq * c8;
        uint4* o = reinterpret_cast<uint4*>(out + bh * g.Lq * g.Dv);
        for (int i = tid; i < n8; i += NT) {
            const int r = i / c8, c = (i - r * c8) * 8;
            const float* src = Os + r * g.ldo + c;
            uint4 raw;
            __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
            for (int u = 0; u < 4; ++u) e[u] = __floats2bfloat162_rn(src[2 * u], src[2 * u + 1]);
            __stcs(o + i, raw);
        }
    }
}

// x [B,H,Lq,Dk] f32, y [B,H,Dk,Lk] f32, mask [B|1,H|1,Lq,Lk] bf16, sinks [H] bf16, z [B,H,Lk,Dv] bf16 -> [B,H,Lq,Dv] bf16.
torch::Tensor sink_attention(torch::Tensor x, torch::Tensor y, torch::Tensor mask, torch::Tensor sinks, torch::Tensor z, double scale) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4 && y.dim() == 4 && z.dim() == 4 && mask.dim() == 4, "sink_attention: 4-d CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat, "sink_attention: x, y float32");
    TORCH_CHECK(z.scalar_type() == torch::kBFloat16 && mask.scalar_type() == torch::kBFloat16 && sinks.scalar_type() == torch::kBFloat16,
                "sink_attention: z, mask, sinks bfloat16");
    const int B = x.size(0), H = x.size(1);
    Geo g;
    g.Lq = x.size(2); g.Dk = x.size(3); g.Lk = y.size(3); g.Dv = z.size(3);
    TORCH_CHECK(y.size(0) == B && y.size(1) == H && y.size(2) == g.Dk && z.size(0) == B && z.size(1) == H && z.size(2) == g.Lk,
                "sink_attention: x, y, z sizes differ");
    TORCH_CHECK(mask.size(2) == g.Lq && mask.size(3) == g.Lk && (mask.size(0) == 1 || mask.size(0) == B) &&
                (mask.size(1) == 1 || mask.size(1) == H) && sinks.numel() == H, "sink_attention: mask / sinks sizes");
    TORCH_CHECK(g.Lq >= 1 && g.Lk >= 1 && g.Lq <= MAXT * 16 && g.Lk <= MAXT * 16 && g.Dk % 8 == 0 && g.Lk % 4 == 0 && g.Dv % 16 == 0,
                "sink_attention: built for Lq, Lk <= 128, Lk % 4 == 0, Dk % 8 == 0, Dv % 16 == 0");
    g.LqP = (g.Lq + 15) / 16 * 16; g.LkP = (g.Lk + 15) / 16 * 16;
    g.ldq = g.Dk + 4; g.ldk = g.LkP + 4; g.lds = g.LkP + 4; g.ldp = g.LkP + 8; g.ldv = g.Dv + 8; g.ldo = g.Dv + 4;
    auto r32 = [](size_t v) { return (v + 127) / 128 * 128; };
    g.r1 = r32(std::max((size_t)g.LqP * g.ldq * 4, (size_t)g.LqP * g.ldp * 2));
    g.r2 = r32(std::max({(size_t)g.Dk * g.ldk * 4, (size_t)g.LqP * g.lds * 4, (size_t)g.LqP * g.ldo * 4}));
    g.r3 = r32((size_t)g.LkP * g.ldv * 2);
    const size_t smem = g.r1 + g.r2 + g.r3;
    TORCH_CHECK(smem <= 227 * 1024, "sink_attention: head too large for one block (", smem, " bytes)");
    auto xc = x.contiguous(), yc = y.contiguous(), zc = z.contiguous(), mc = mask.contiguous(), sc = sinks.contiguous();
    auto out = torch::empty({B, H, g.Lq, g.Dv}, z.options());
    if (B == 0 || H == 0) return out;
    const int64_t msh = mask.size(1) == 1 ? 0 : (int64_t)g.Lq * g.Lk;
    const int64_t msb = mask.size(0) == 1 ? 0 : (int64_t)mask.size(1) * g.Lq * g.Lk;
    cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
    cudaFuncSetAttribute(sink_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    sink_attn_kernel<<<(unsigned)((int64_t)B * H), NT, smem, st>>>(
        xc.data_ptr<float>(), yc.data_ptr<float>(), reinterpret_cast<const __nv_bfloat16*>(mc.data_ptr()),
        reinterpret_cast<const __nv_bfloat16*>(sc.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(zc.data_ptr()),
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), g, H, msb, msh, (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(sink_attention, "softmax(cat(x @ y * scale + mask, sinks))[..., :-1].bf16() @ z in one kernel per (batch, head)");
