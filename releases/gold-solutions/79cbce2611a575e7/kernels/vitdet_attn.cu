// VitDet attention tail: v6 = z + proj(merge_heads(softmax(x) @ y)), v7 = LayerNorm(v6); bfloat16.
// x [B * H, N, N] scores, y [B * H, N, 64] values, z [B, S1, S2, H * 64] (S1 * S2 = N), proj = Linear(C, C).
// Design, three launches:
//   1. softmax + P @ V: one block (8 warps) per (batch-head, tile of 112 query rows); each warp loads its 14
//      rows at once (8-byte loads, all in flight), does max / exp / sum with shuffles in float32, rounds P to
//      bf16 (as the reference) into shared memory; P @ V on bf16 tensor cores (wmma m16n16k16, float32
//      accumulate); the result is stored straight into the merged-head layout A [B, N, H * 64] (the view /
//      permute / reshape is only the store index), 16-byte stores.
//   2. cuBLASLt GEMM: v5 = A @ W^T + bias (BIAS epilogue), bf16 out.
//   3. residual + LayerNorm: v6 = z + v5 and v7 = LayerNorm(v6), one warp per row, 16-byte loads / stores,
//      two-pass variance in registers. v5 and v6 are rounded to bf16 in the reference's order (folding z into
//      the GEMM as its C operand saves 116 MB but rounds once instead of twice: in a float64 emulation that
//      took v7 from 0.19 to 0.49 of the bf16 tolerance).
// Bytes (public shape): x 354 MB + y 11.6 MB read, A 116 MB written (1); A 116 MB read, v5 116 MB written,
// 89 GFLOP (2); v5 + z 231 MB read, v6 + v7 231 MB written (3): ~1.17 GB -> ~245 us of traffic + GEMM.
// roofline_ms 0.170, compile_ms 0.840; predicted ~0.38 ms.
#include "registry.h"
#include "lt_linear.cuh"
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

constexpr int TM = 112;            // query rows per block (7 wmma row tiles)
constexpr int NW = 8;
constexpr int NT = NW * 32;
constexpr int RPW = TM / NW;       // rows per warp (14)
constexpr int DH = 64;             // head dim
constexpr int MAXL = 256;          // key length bound (chunks of 4 per lane: 2)
constexpr int LDV = DH + 8;
constexpr int LDO = DH + 4;

__global__ void __launch_bounds__(NT) softmax_pv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ y,
                                                        __nv_bfloat16* __restrict__ A, int H, int N, int L, int tiles) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int LP = (L + 15) & ~15, ldp = LP + 8;
    __nv_bfloat16* Ps = reinterpret_cast<__nv_bfloat16*>(smem);                  // [TM][ldp]
    float* Os = reinterpret_cast<float*>(smem);                                  // [TM][LDO] (after P @ V)
    const size_t pbytes = ((size_t)TM * ldp * 2 > (size_t)TM * LDO * 4 ? (size_t)TM * ldp * 2 : (size_t)TM * LDO * 4);
    __nv_bfloat16* Vs = reinterpret_cast<__nv_bfloat16*>(smem + ((pbytes + 127) & ~(size_t)127));   // [LP][LDV]
    const int64_t bh = blockIdx.x / tiles;
    const int r0 = (int)(blockIdx.x - bh * tiles) * TM;
    const int rows = min(TM, N - r0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // values: L x 64 contiguous -> Vs, zero rows L..LP
    {
        const uint4* src = reinterpret_cast<const uint4*>(y + bh * L * DH);
        constexpr int U = 8;  // loads in flight per thread
        for (int i0 = tid; i0 < L * (DH / 8); i0 += NT * U) {
            uint4 rv[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i0 + u * NT < L * (DH / 8)) rv[u] = __ldg(src + i0 + u * NT);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * NT;
                if (i < L * (DH / 8)) *reinterpret_cast<uint4*>(Vs + (i >> 3) * LDV + (i & 7) * 8) = rv[u];
            }
        }
        for (int i = tid; i < (LP - L) * (DH / 8); i += NT) {
            const int r = L + (i >> 3), c = (i & 7) * 8;
            *reinterpret_cast<uint4*>(Vs + r * LDV + c) = make_uint4(0, 0, 0, 0);
        }
    }
    // softmax: warp rows warp, warp + NW, ...; all loads first
    const int nch = L >> 2;  // 4-element chunks per row
    const __nv_bfloat16* xb = x + (bh * N + r0) * (int64_t)L;
    uint2 raw[RPW][2];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp + NW * i;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const int c = lane + 32 * t;
            raw[i][t] = (r < rows && c < nch) ? __ldcs(reinterpret_cast<const uint2*>(xb + (int64_t)r * L) + c) : make_uint2(0, 0);
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp + NW * i;
        __nv_bfloat16* prow = Ps + r * ldp;
        if (r >= rows) {
            for (int j = lane; j < LP; j += 32) prow[j] = __float2bfloat16(0.f);
            continue;
        }
        float v[2][4];
        float m = -INFINITY;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw[i][t]);
            const bool ok = lane + 32 * t < nch;
#pragma unroll
            for (int u = 0; u < 4; ++u) { v[t][u] = ok ? __bfloat162float(e[u]) : -INFINITY; m = fmaxf(m, v[t][u]); }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int u = 0; u < 4; ++u) { v[t][u] = __expf(v[t][u] - m); s += v[t][u]; }
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float inv = 1.f / s;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const int c = (lane + 32 * t) * 4;
            if (c < LP) {
                uint2 pk;
                __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&pk);
                e[0] = __floats2bfloat162_rn(v[t][0] * inv, v[t][1] * inv);   // padding lanes hold exp(-inf) = 0
                e[1] = __floats2bfloat162_rn(v[t][2] * inv, v[t][3] * inv);
                *reinterpret_cast<uint2*>(prow + c) = pk;
            }
        }
    }
    __syncthreads();
    // P @ V: warp -> column tile (warp & 3), row tiles (warp >> 2) + 2 i
    const int ct = warp & 3;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) wmma::fill_fragment(acc[i], 0.f);
    for (int k = 0; k < LP; k += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, Vs + k * LDV + ct * 16, LDV);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int rt = (warp >> 2) + 2 * i;
            if (rt < TM / 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::load_matrix_sync(fa, Ps + rt * 16 * ldp + k, ldp);
                wmma::mma_sync(acc[i], fa, fb, acc[i]);
            }
        }
    }
    __syncthreads();  // P is dead: O overwrites it
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int rt = (warp >> 2) + 2 * i;
        if (rt < TM / 16) wmma::store_matrix_sync(Os + rt * 16 * LDO + ct * 16, acc[i], LDO, wmma::mem_row_major);
    }
    __syncthreads();
    const int b = (int)(bh / H), h = (int)(bh - (int64_t)b * H);
    for (int i = tid; i < rows * (DH / 8); i += NT) {
        const int r = i >> 3, c = (i & 7) * 8;
        const float* src = Os + r * LDO + c;
        uint4 pk;
        __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&pk);
#pragma unroll
        for (int u = 0; u < 4; ++u) e[u] = __floats2bfloat162_rn(src[2 * u], src[2 * u + 1]);
        *reinterpret_cast<uint4*>(A + (((int64_t)b * N + r0 + r) * H + h) * DH + c) = pk;
    }
}

template <int MAXV>
__global__ void __launch_bounds__(256) add_layernorm_kernel(const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ z,
                                                            const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ bias,
                                                            __nv_bfloat16* __restrict__ v6, __nv_bfloat16* __restrict__ out,
                                                            int64_t rows, int C, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int nv = C >> 3;
    const uint4* src = reinterpret_cast<const uint4*>(v + row * C);
    const uint4* zsrc = reinterpret_cast<const uint4*>(z + row * C);
    float f[MAXV][8];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int c = lane + 32 * k;
        if (c < nv) {
            uint4 raw = __ldcs(src + c), rz = __ldcs(zsrc + c), pk;
            const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
            const __nv_bfloat16* ez = reinterpret_cast<const __nv_bfloat16*>(&rz);
            __nv_bfloat16* ep = reinterpret_cast<__nv_bfloat16*>(&pk);
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                ep[u] = __float2bfloat16_rn(__bfloat162float(ez[u]) + __bfloat162float(e[u]));  // v6 = z + v5, in bf16
                f[k][u] = __bfloat162float(ep[u]);
                s += f[k][u];
            }
            __stcs(reinterpret_cast<uint4*>(v6 + row * C) + c, pk);
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float mean = s / C;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < MAXV; ++k)
        if (lane + 32 * k < nv)
#pragma unroll
            for (int u = 0; u < 8; ++u) { float d = f[k][u] - mean; q += d * d; }
#pragma unroll
    for (int o = 16; o; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    const float rstd = rsqrtf(q / C + eps);
#pragma unroll
    for (int k = 0; k < MAXV; ++k) {
        const int c = lane + 32 * k;
        if (c < nv) {
            uint4 rw = __ldg(reinterpret_cast<const uint4*>(w) + c), rb = __ldg(reinterpret_cast<const uint4*>(bias) + c), pk;
            const __nv_bfloat16* ew = reinterpret_cast<const __nv_bfloat16*>(&rw);
            const __nv_bfloat16* eb = reinterpret_cast<const __nv_bfloat16*>(&rb);
            __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&pk);
#pragma unroll
            for (int u = 0; u < 4; ++u)
                e[u] = __floats2bfloat162_rn((f[k][2 * u] - mean) * rstd * __bfloat162float(ew[2 * u]) + __bfloat162float(eb[2 * u]),
                                             (f[k][2 * u + 1] - mean) * rstd * __bfloat162float(ew[2 * u + 1]) + __bfloat162float(eb[2 * u + 1]));
            __stcs(reinterpret_cast<uint4*>(out + row * C) + c, pk);
        }
    }
}

// x [B*H, N, N], y [B*H, N, 64], z [B, S1, S2, H*64] bf16; proj weight [C, C], bias [C]; norm weight, bias [C]
// -> (v6, v7) both [B, S1, S2, C].
std::vector<torch::Tensor> vitdet_attn(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor pw, torch::Tensor pb,
                                       torch::Tensor nw, torch::Tensor nb, double eps) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 3 && y.dim() == 3 && z.dim() == 4, "vitdet_attn: x [BH,N,L], y [BH,L,64], z [B,S1,S2,C] CUDA");
    for (auto* t : {&x, &y, &z, &pw, &pb, &nw, &nb}) TORCH_CHECK(t->scalar_type() == torch::kBFloat16, "vitdet_attn: bfloat16 expected");
    const int64_t BH = x.size(0);
    const int N = x.size(1), L = x.size(2);
    const int64_t B = z.size(0);
    const int C = z.size(3);
    TORCH_CHECK(y.size(0) == BH && y.size(1) == L && y.size(2) == DH, "vitdet_attn: y must be [BH, L, 64]");
    TORCH_CHECK(B > 0 && BH % B == 0 && (BH / B) * DH == C && z.size(1) * z.size(2) == N, "vitdet_attn: head split does not match z");
    TORCH_CHECK(L % 4 == 0 && L <= MAXL && L > 0 && C % 8 == 0 && C <= 32 * 8 * 4, "vitdet_attn: built for L % 4 == 0, L <= 256, C <= 1024");
    TORCH_CHECK(pw.size(0) == C && pw.size(1) == C && pb.numel() == C && nw.numel() == C && nb.numel() == C, "vitdet_attn: parameter sizes");
    const int H = (int)(BH / B);
    auto xc = x.contiguous(), yc = y.contiguous(), zc = z.contiguous(), pwc = pw.contiguous(), pbc = pb.contiguous();
    auto nwc = nw.contiguous(), nbc = nb.contiguous();
    auto v6 = torch::empty_like(zc), v7 = torch::empty_like(zc);
    if (N == 0) return {v6, v7};
    auto A = torch::empty({B, N, C}, z.options());
    cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
    const int tiles = (N + TM - 1) / TM;
    const int LP = (L + 15) & ~15;
    size_t pbytes = std::max((size_t)TM * (LP + 8) * 2, (size_t)TM * LDO * 4);
    pbytes = (pbytes + 127) & ~(size_t)127;
    const size_t smem = pbytes + (size_t)LP * LDV * 2;
    cudaFuncSetAttribute(softmax_pv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    using bf = __nv_bfloat16;
    softmax_pv_kernel<<<(unsigned)(BH * tiles), NT, smem, st>>>(reinterpret_cast<const bf*>(xc.data_ptr()),
                                                                reinterpret_cast<const bf*>(yc.data_ptr()), reinterpret_cast<bf*>(A.data_ptr()),
                                                                H, N, L, tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t M = B * N;
    auto v5 = torch::empty_like(zc);
    ltlin::linear(A.data_ptr(), pwc.data_ptr(), pbc.data_ptr(), nullptr, v5.data_ptr(), M, C, C, CUDA_R_16BF, st, z.options());
    const unsigned lblocks = (unsigned)((M + 7) / 8);
    auto p = [](torch::Tensor& t) { return reinterpret_cast<bf*>(t.data_ptr()); };
    if (C / 8 <= 96) add_layernorm_kernel<3><<<lblocks, 256, 0, st>>>(p(v5), p(zc), p(nwc), p(nbc), p(v6), p(v7), M, C, (float)eps);
    else add_layernorm_kernel<4><<<lblocks, 256, 0, st>>>(p(v5), p(zc), p(nwc), p(nbc), p(v6), p(v7), M, C, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {v6, v7};
}
OPFORGE_EXPORT(vitdet_attn, "(z + proj(merge_heads(softmax(x) @ y)), LayerNorm of it): fused softmax + PV, cuBLASLt GEMM, LayerNorm");
