// Top-p (nucleus) logits warper + softmax over a vocabulary, float32, one block per row of x [B, V]:
//   v = x * (1/T); p_sorted = softmax(sort(v)); drop the ascending prefix whose cumulative probability <= top_p;
//   out = softmax(v with the dropped tokens at -inf).
// No sort: with e = exp(v - max) (exp is monotone, so e orders the tokens like v) and Z = sum(e), a token is dropped
// iff the mass of the tokens up to and including it, S(<= e), is <= top_p * Z. The cut T (as float bits of e) is found
// by bisection on f(t) = sum(e : bits(e) < t), with early exit once a single token is left in the open interval.
// Tokens with e <= p * Z / V are dropped for certain; the search runs only over the rest, compacted in shared memory.
// The row lives in shared memory when it fits (V <= ~56K floats), else in the output row (global) as scratch.
// HBM traffic: x read once, out written once (8 bytes per element).
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sums (or maxes) NV values over the block; every thread gets the results. red: [NV][32] + NV floats.
template <int NV, bool kMax>
__device__ void block_reduce(float (&v)[NV], float* red) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = kMax ? warp_max(v[j]) : warp_sum(v[j]);
    __syncthreads();
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < NV; ++j) red[j * 32 + wid] = v[j];
    __syncthreads();
    if (wid == 0) {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            float t = lane < nw ? red[j * 32 + lane] : (kMax ? -INFINITY : 0.f);
            t = kMax ? warp_max(t) : warp_sum(t);
            if (lane == 0) red[NV * 32 + j] = t;
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] = red[NV * 32 + j];
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads) topp_softmax_kernel(const float* __restrict__ x, float* __restrict__ out,
                                                                int V, float invT, float top_p, bool use_smem, int cap) {
    extern __shared__ float4 smem4[];
    __shared__ float red[3 * 32 + 3];
    __shared__ int ccount;
    const int64_t row = blockIdx.x;
    const float* xr = x + row * (int64_t)V;
    float* orow = out + row * (int64_t)V;
    float* buf = use_smem ? reinterpret_cast<float*>(smem4) : orow;
    const int tid = threadIdx.x;
    const int nv4 = kVec ? V / 4 : 0;
    float4* b4 = reinterpret_cast<float4*>(buf);

    // pass 1: v = x / T into buf, row max
    float m = -INFINITY;
    if (kVec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int i0 = tid; i0 < nv4; i0 += 4 * kThreads) {  // 4 loads in flight per thread
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (i0 + u * kThreads < nv4) v[u] = __ldcs(x4 + i0 + u * kThreads);
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (i0 + u * kThreads < nv4) {
                    v[u].x *= invT; v[u].y *= invT; v[u].z *= invT; v[u].w *= invT;
                    b4[i0 + u * kThreads] = v[u];
                    m = fmaxf(m, fmaxf(fmaxf(v[u].x, v[u].y), fmaxf(v[u].z, v[u].w)));
                }
        }
    } else {
        for (int i = tid; i < V; i += kThreads) {
            const float v = xr[i] * invT;
            buf[i] = v;
            m = fmaxf(m, v);
        }
    }
    float mv[1] = {m};
    block_reduce<1, true>(mv, red);
    const float vmax = mv[0];

    // pass 2: e = exp(v - max) in place, Z = sum(e)
    float s = 0.f;
    if (kVec) {
        for (int i = tid; i < nv4; i += kThreads) {
            float4 v = b4[i];
            v.x = expf(v.x - vmax); v.y = expf(v.y - vmax); v.z = expf(v.z - vmax); v.w = expf(v.w - vmax);
            b4[i] = v;
            s += (v.x + v.y) + (v.z + v.w);
        }
    } else {
        for (int i = tid; i < V; i += kThreads) {
            const float e = expf(buf[i] - vmax);
            buf[i] = e;
            s += e;
        }
    }
    float zv[1] = {s};
    block_reduce<1, false>(zv, red);
    const float target = top_p * zv[0];

    // Tokens with e <= target / V are always dropped (the mass up to them is <= V * e <= target): their mass is the
    // base f0, and only the others (a few percent of the row for random logits) enter the search, compacted after
    // the row in shared memory. A list that does not fit falls back to searching the whole row.
    const float floor_e = target / (float)V;
    const uint32_t fb = __float_as_uint(floor_e);
    float* cbuf = buf + (kVec ? 4 * nv4 : V);
    if (tid == 0) ccount = 0;
    __syncthreads();
    float f0 = 0.f;
    const int lane = tid & 31;
    auto append = [&](float e, bool valid) {  // warp-aggregated append of e > floor_e; all 32 lanes call it
        const bool take = valid && __float_as_uint(e) > fb;
        const unsigned bal = __ballot_sync(0xffffffffu, take);
        int base = 0;
        if (lane == 0 && bal) base = atomicAdd(&ccount, __popc(bal));
        base = __shfl_sync(0xffffffffu, base, 0);
        if (take) {
            const int pos = base + __popc(bal & ((1u << lane) - 1u));
            if (pos < cap) cbuf[pos] = e;
        } else if (valid) {
            f0 += e;
        }
    };
    if (cap > 0) {  // loops are warp-uniform: every lane runs every iteration
        if (kVec) {
            for (int i0 = tid - lane; i0 < nv4; i0 += kThreads) {
                const int i = i0 + lane;
                const bool valid = i < nv4;
                const float4 v = valid ? b4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
                append(v.x, valid); append(v.y, valid); append(v.z, valid); append(v.w, valid);
            }
        } else {
            for (int i0 = tid - lane; i0 < V; i0 += kThreads) {
                const int i = i0 + lane;
                const bool valid = i < V;
                append(valid ? buf[i] : 0.f, valid);
            }
        }
    }
    float f0v[1] = {f0};
    block_reduce<1, false>(f0v, red);  // also orders the appends before the read of ccount
    const int nc = ccount;
    const bool compact = cap > 0 && nc <= cap;
    const float* sbuf = compact ? cbuf : buf;
    const int sn = compact ? nc : V;
    const float base_mass = compact ? f0v[0] : 0.f;

    // bisection: largest T with f(T) <= target, f(t) = sum(e : bits(e) < t); f(lo) <= target < f(hi) throughout
    // (compact: every token outside the list has bits <= fb < lo, its mass is in base_mass)
    uint32_t lo = compact ? fb + 1 : 0u, hi = 0x3f800001u;
    const bool svec = !compact && kVec;
    const float4* s4 = reinterpret_cast<const float4*>(sbuf);
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        float acc[3] = {0.f, 0.f, 0.f};  // f(mid) partial, count in [lo, mid), count in [mid, hi)
        auto visit = [&](float e) {
            const uint32_t b = __float_as_uint(e);
            acc[0] += b < mid ? e : 0.f;
            acc[1] += (b >= lo && b < mid) ? 1.f : 0.f;
            acc[2] += (b >= mid && b < hi) ? 1.f : 0.f;
        };
        if (svec) {
            for (int i = tid; i < nv4; i += kThreads) {
                const float4 v = s4[i];
                visit(v.x); visit(v.y); visit(v.z); visit(v.w);
            }
        } else {
            for (int i = tid; i < sn; i += kThreads) visit(sbuf[i]);
        }
        block_reduce<3, false>(acc, red);
        float left;
        if (base_mass + acc[0] <= target) {
            lo = mid;
            left = acc[2];
        } else {
            hi = mid;
            left = acc[1];
        }
        if (left <= 1.f) {
            // one token left in [lo, hi): it is the cut (f is flat up to it and reaches f(hi) right after it)
            float bm[1] = {0.f};
            auto pick = [&](float e) {
                const uint32_t b = __float_as_uint(e);
                if (b >= lo && b < hi) bm[0] = fmaxf(bm[0], e);
            };
            if (svec) {
                for (int i = tid; i < nv4; i += kThreads) {
                    const float4 v = s4[i];
                    pick(v.x); pick(v.y); pick(v.z); pick(v.w);
                }
            } else {
                for (int i = tid; i < sn; i += kThreads) pick(sbuf[i]);
            }
            block_reduce<1, true>(bm, red);
            if (left == 1.f) lo = __float_as_uint(bm[0]);
            break;
        }
    }
    const uint32_t cut = lo;

    // kept mass and the normalised, masked output
    float k = 0.f;
    if (kVec) {
        for (int i = tid; i < nv4; i += kThreads) {
            const float4 v = b4[i];
            k += (__float_as_uint(v.x) >= cut ? v.x : 0.f) + (__float_as_uint(v.y) >= cut ? v.y : 0.f) +
                 (__float_as_uint(v.z) >= cut ? v.z : 0.f) + (__float_as_uint(v.w) >= cut ? v.w : 0.f);
        }
    } else {
        for (int i = tid; i < V; i += kThreads) {
            const float e = buf[i];
            k += __float_as_uint(e) >= cut ? e : 0.f;
        }
    }
    float kv[1] = {k};
    block_reduce<1, false>(kv, red);
    const float inv = 1.f / kv[0];
    if (kVec) {
        float4* o4 = reinterpret_cast<float4*>(orow);
        for (int i = tid; i < nv4; i += kThreads) {
            const float4 v = b4[i];
            float4 o;
            o.x = __float_as_uint(v.x) >= cut ? v.x * inv : 0.f;
            o.y = __float_as_uint(v.y) >= cut ? v.y * inv : 0.f;
            o.z = __float_as_uint(v.z) >= cut ? v.z * inv : 0.f;
            o.w = __float_as_uint(v.w) >= cut ? v.w * inv : 0.f;
            __stcs(o4 + i, o);
        }
    } else {
        for (int i = tid; i < V; i += kThreads) {
            const float e = buf[i];
            orow[i] = __float_as_uint(e) >= cut ? e * inv : 0.f;
        }
    }
}

}  // namespace

torch::Tensor topp_softmax(torch::Tensor x, double top_p, double temperature) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 2, "topp_softmax: [B, V] float32 CUDA tensor expected");
    TORCH_CHECK(x.is_contiguous(), "topp_softmax: contiguous x expected");
    TORCH_CHECK(top_p >= 0.0 && top_p < 1.0, "topp_softmax: top_p must be in [0, 1)");
    TORCH_CHECK(temperature > 0, "topp_softmax: temperature must be positive");
    const int64_t B = x.size(0);
    const int V = (int)x.size(1);
    auto out = torch::empty_like(x);
    if (B == 0 || V == 0) return out;
    const float invT = 1.0f / (float)temperature;  // eager CUDA divides by a scalar as a multiply by its reciprocal
    int dev = 0, optin = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const size_t need = (size_t)V * sizeof(float);
    const size_t static_smem = (3 * 32 + 3) * sizeof(float) + sizeof(int);
    const bool use_smem = need + static_smem + 1024 <= (size_t)optin;
    // the rest of the opt-in shared memory holds the compacted search list (capped at V floats)
    const int cap = use_smem ? (int)std::min<size_t>((size_t)V, ((size_t)optin - need - static_smem - 1024) / sizeof(float)) : 0;
    const size_t smem = use_smem ? need + (size_t)cap * sizeof(float) : 0;
    const bool vec = V % 4 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
        if (smem > 48 * 1024)
            C10_CUDA_CHECK(cudaFuncSetAttribute(topp_softmax_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        topp_softmax_kernel<true><<<(unsigned)B, kThreads, smem, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), V, invT,
                                                                           (float)top_p, use_smem, cap);
    } else {
        if (smem > 48 * 1024)
            C10_CUDA_CHECK(cudaFuncSetAttribute(topp_softmax_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        topp_softmax_kernel<false><<<(unsigned)B, kThreads, smem, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), V, invT,
                                                                            (float)top_p, use_smem, cap);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(topp_softmax, "softmax(top-p mask(x / T)) per row: bisection on the probability mass, no sort");
