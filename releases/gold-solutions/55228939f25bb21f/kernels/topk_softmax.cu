// Top-k logits warper + softmax over a vocabulary, float32:
//   v = x * (1/T);  out = softmax(where(v < kth_largest(v), -inf, v))  per row of x [B, V].
// Radix threshold select instead of a sort, over order-preserving 32-bit keys of v:
//   1. topk_hist    (grid chunks x rows): histogram of the keys' top 12 bits per row (shared-memory atomics),
//                                         counting only bins that can hold the k-th largest.
//   2. topk_bin     (one block per row)  : the bin holding the k-th largest key (block scan over 4096 bins).
//   3. topk_gather  (grid chunks x rows): writes the row's zeros and appends every element of that bin or above
//                                         (about k..few hundred per row) to a candidate list.
//   4. topk_finish  (one block per row)  : exact k-th largest among the candidates (8-bit radix passes in shared
//                                         memory), the row max, the softmax sum, and scatters the kept values.
// A row whose candidates overflow the list (degenerate inputs, e.g. many equal values) is finished by the same block
// with radix passes over the whole row, so every input stays exact. HBM traffic: x read twice, out written once.
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>

namespace {

constexpr int kBins = 4096;      // top 12 key bits
constexpr int kShift = 20;
constexpr int kCap = 4096;       // candidates per row
constexpr int kChunk = 8192;     // elements per block in the streaming passes
constexpr int kStreamThreads = 256;
constexpr int kFinishThreads = 1024;

__device__ __forceinline__ uint32_t fkey(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float fval(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Only whole bins at or above a lower bound of the row's k-th largest key are counted: 50 threads' maxima are k
// distinct elements of the row, so the k-th largest is >= their minimum. Bins at or above the highest bound of all
// blocks (where the k-th largest lies) are therefore counted exactly, and ~90 % of the shared-memory atomics vanish.
constexpr int kPerThread = kChunk / kStreamThreads;  // 32 elements in registers

template <bool kVec>
__global__ void __launch_bounds__(kStreamThreads) topk_hist(const float* __restrict__ x, uint32_t* __restrict__ hist,
                                                            int V, float invT, int k) {
    __shared__ uint32_t sh[kBins];
    __shared__ uint32_t tmax[kStreamThreads];
    for (int i = threadIdx.x; i < kBins; i += blockDim.x) sh[i] = 0;
    const int64_t row = blockIdx.y;
    const int c0 = blockIdx.x * kChunk;
    const int c1 = min(V, c0 + kChunk);
    const float* xr = x + row * (int64_t)V;
    uint32_t keys[kPerThread];
    uint32_t m = 0;  // 0 = no element (below every real key)
    if (kVec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll
        for (int j = 0; j < kPerThread / 4; ++j) {
            const int i = c0 / 4 + j * kStreamThreads + threadIdx.x;
            if (i < c1 / 4) {
                const float4 v = __ldg(x4 + i);
                keys[4 * j] = fkey(v.x * invT);
                keys[4 * j + 1] = fkey(v.y * invT);
                keys[4 * j + 2] = fkey(v.z * invT);
                keys[4 * j + 3] = fkey(v.w * invT);
            } else {
                keys[4 * j] = keys[4 * j + 1] = keys[4 * j + 2] = keys[4 * j + 3] = 0;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
            const int i = c0 + j * kStreamThreads + threadIdx.x;
            keys[j] = i < c1 ? fkey(xr[i] * invT) : 0u;
        }
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) m = max(m, keys[j]);
    tmax[threadIdx.x] = m;
    __syncthreads();
    uint32_t lb = 0;
    if (k <= kStreamThreads) {
        lb = 0xffffffffu;
        for (int t = 0; t < k; ++t) lb = min(lb, tmax[t]);
    }
    const uint32_t lbin = lb >> kShift;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j)
        if ((keys[j] >> kShift) >= lbin && keys[j] != 0u) atomicAdd(&sh[keys[j] >> kShift], 1u);
    __syncthreads();
    uint32_t* hr = hist + row * kBins;
    for (int i = threadIdx.x; i < kBins; i += blockDim.x)
        if (sh[i]) atomicAdd(hr + i, sh[i]);
}

// bin b (0..4095) with count(bins >= b) >= k > count(bins > b); 256 threads, 16 bins each, in descending order.
__global__ void topk_bin(const uint32_t* __restrict__ hist, int* __restrict__ sel, int k) {
    __shared__ uint32_t sh[kBins];
    __shared__ uint32_t warp_tot[8];
    const int64_t row = blockIdx.x;
    const uint32_t* hr = hist + row * kBins;
    for (int i = threadIdx.x; i < kBins; i += blockDim.x) sh[i] = hr[i];
    __syncthreads();
    const int t = threadIdx.x, lane = t & 31, wid = t >> 5;
    const int top = kBins - 1 - 16 * t;
    uint32_t s = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) s += sh[top - j];
    uint32_t incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    if (lane == 31) warp_tot[wid] = incl;
    __syncthreads();
    for (int w = 0; w < wid; ++w) incl += warp_tot[w];
    const uint32_t excl = incl - s;
    if (excl < (uint32_t)k && incl >= (uint32_t)k) {
        uint32_t run = excl;
        for (int j = 0; j < 16; ++j) {
            run += sh[top - j];
            if (run >= (uint32_t)k) {
                sel[row] = top - j;
                break;
            }
        }
    }
}

template <bool kVec>
__global__ void __launch_bounds__(kStreamThreads) topk_gather(const float* __restrict__ x, float* __restrict__ out, const int* __restrict__ sel,
                            int* __restrict__ cnt, uint32_t* __restrict__ ckey, int* __restrict__ cidx, int V,
                            float invT) {
    const int64_t row = blockIdx.y;
    const uint32_t b = (uint32_t)sel[row];
    const int c0 = blockIdx.x * kChunk;
    const int c1 = min(V, c0 + kChunk);
    const float* xr = x + row * (int64_t)V;
    float* orow = out + row * (int64_t)V;
    int* rc = cnt + row;
    uint32_t* rk = ckey + row * kCap;
    int* ri = cidx + row * kCap;
    auto take = [&](float xv, int i) {
        const uint32_t key = fkey(xv * invT);
        if ((key >> kShift) >= b) {
            const int p = atomicAdd(rc, 1);
            if (p < kCap) {
                rk[p] = key;
                ri[p] = i;
            }
        }
    };
    if (kVec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* o4 = reinterpret_cast<float4*>(orow);
        float4 v[kPerThread / 4];  // the whole chunk share of this thread in flight at once
#pragma unroll
        for (int j = 0; j < kPerThread / 4; ++j) {
            const int i = c0 / 4 + j * kStreamThreads + threadIdx.x;
            if (i < c1 / 4) v[j] = __ldcs(x4 + i);
        }
#pragma unroll
        for (int j = 0; j < kPerThread / 4; ++j) {
            const int i = c0 / 4 + j * kStreamThreads + threadIdx.x;
            if (i < c1 / 4) {
                __stcs(o4 + i, make_float4(0.f, 0.f, 0.f, 0.f));
                take(v[j].x, 4 * i);
                take(v[j].y, 4 * i + 1);
                take(v[j].z, 4 * i + 2);
                take(v[j].w, 4 * i + 3);
            }
        }
    } else {
        for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
            orow[i] = 0.f;
            take(xr[i], i);
        }
    }
}

// k-th largest (1-based) of n keys given by key_at(i): four 8-bit radix passes; every thread gets the result.
template <class KeyAt>
__device__ uint32_t block_kth_largest(KeyAt key_at, int n, int k, uint32_t* hist256, int* state) {
    uint32_t prefix = 0, mask = 0;
    int kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist256[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t key = key_at(i);
            if ((key & mask) == prefix) atomicAdd(&hist256[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            uint32_t s = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) s += hist256[255 - 8 * lane - j];
            uint32_t incl = s;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const uint32_t excl = incl - s;
            if (excl < (uint32_t)kk && incl >= (uint32_t)kk) {
                uint32_t run = excl;
                for (int j = 0; j < 8; ++j) {
                    const int d = 255 - 8 * lane - j;
                    if (run + hist256[d] >= (uint32_t)kk) {
                        state[0] = d;
                        state[1] = kk - (int)run;
                        break;
                    }
                    run += hist256[d];
                }
            }
        }
        __syncthreads();
        prefix |= (uint32_t)state[0] << shift;
        mask |= 255u << shift;
        kk = state[1];
        __syncthreads();
    }
    return prefix;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ uint32_t warp_umax(uint32_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}
__device__ uint32_t block_umax(uint32_t v, uint32_t* red) {
    v = warp_umax(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0u;
        v = warp_umax(v);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}

__global__ void topk_finish(const float* __restrict__ x, float* __restrict__ out, const int* __restrict__ cnt,
                            const uint32_t* __restrict__ ckey, const int* __restrict__ cidx, int V, int k, float invT) {
    __shared__ uint32_t sk[kCap];
    __shared__ int si[kCap];
    __shared__ uint32_t hist256[256];
    __shared__ int state[2];
    __shared__ float redf[33];
    __shared__ uint32_t redu[33];
    const int64_t row = blockIdx.x;
    const int n = cnt[row];
    const float* xr = x + row * (int64_t)V;
    float* orow = out + row * (int64_t)V;
    if (n <= kCap) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            sk[i] = ckey[row * kCap + i];
            si[i] = cidx[row * kCap + i];
        }
        __syncthreads();
        uint32_t m = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) m = max(m, sk[i]);
        const float vmax = fval(block_umax(m, redu));
        const uint32_t thr = block_kth_largest([&](int i) { return sk[i]; }, n, k, hist256, state);
        float s = 0.f;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (sk[i] >= thr) s += expf(fval(sk[i]) - vmax);
        const float inv = 1.f / block_sum(s, redf);
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (sk[i] >= thr) orow[si[i]] = expf(fval(sk[i]) - vmax) * inv;
    } else {  // overflow: exact select over the whole row (slow path, degenerate inputs only)
        auto key_at = [&](int i) { return fkey(xr[i] * invT); };
        uint32_t m = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) m = max(m, key_at(i));
        const float vmax = fval(block_umax(m, redu));
        const uint32_t thr = block_kth_largest(key_at, V, k, hist256, state);
        float s = 0.f;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const uint32_t key = key_at(i);
            if (key >= thr) s += expf(fval(key) - vmax);
        }
        const float inv = 1.f / block_sum(s, redf);
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const uint32_t key = key_at(i);
            if (key >= thr) orow[i] = expf(fval(key) - vmax) * inv;
        }
    }
}

}  // namespace

torch::Tensor topk_softmax(torch::Tensor x, int64_t k, double temperature) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 2, "topk_softmax: [B, V] float32 CUDA tensor expected");
    TORCH_CHECK(x.is_contiguous(), "topk_softmax: contiguous x expected");
    const int64_t B = x.size(0);
    const int V = (int)x.size(1);
    TORCH_CHECK(k >= 1 && k <= V, "topk_softmax: k must be in [1, V]");
    TORCH_CHECK(temperature > 0, "topk_softmax: temperature must be positive");
    auto out = torch::empty_like(x);
    if (B == 0) return out;
    // the true divide of eager CUDA with a scalar divisor multiplies by the float32 reciprocal
    const float invT = 1.0f / (float)temperature;
    auto ints = torch::zeros({B * (kBins + 2)}, x.options().dtype(torch::kInt));  // hist | sel | cnt
    auto cand = torch::empty({2 * B * kCap}, x.options().dtype(torch::kInt));     // keys | indices
    uint32_t* hist = reinterpret_cast<uint32_t*>(ints.data_ptr<int>());
    int* sel = ints.data_ptr<int>() + B * kBins;
    int* cnt = sel + B;
    uint32_t* ckey = reinterpret_cast<uint32_t*>(cand.data_ptr<int>());
    int* cidx = cand.data_ptr<int>() + B * kCap;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const dim3 grid((V + kChunk - 1) / kChunk, (unsigned)B);
    const bool vec = V % 4 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
    if (vec) topk_hist<true><<<grid, kStreamThreads, 0, stream>>>(x.data_ptr<float>(), hist, V, invT, (int)k);
    else topk_hist<false><<<grid, kStreamThreads, 0, stream>>>(x.data_ptr<float>(), hist, V, invT, (int)k);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    topk_bin<<<(unsigned)B, 256, 0, stream>>>(hist, sel, (int)k);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (vec) topk_gather<true><<<grid, kStreamThreads, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), sel, cnt, ckey, cidx, V, invT);
    else topk_gather<false><<<grid, kStreamThreads, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), sel, cnt, ckey, cidx, V, invT);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    topk_finish<<<(unsigned)B, kFinishThreads, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), cnt, ckey, cidx, V, (int)k, invT);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
OPFORGE_EXPORT(topk_softmax, "softmax(top-k mask(x / T)) per row: radix threshold select, no sort");
