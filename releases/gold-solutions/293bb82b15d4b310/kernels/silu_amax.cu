// y = s - max_lastdim(s) with s = bf16(silu(x)), bfloat16 [..., W].
// Tile of R rows (R*W contiguous elements) -> shared memory (coalesced 16-byte loads) -> one thread per row computes
// the max and rewrites the row in place -> coalesced 16-byte stores. Vector width VE = 8 / 4 / 2 / 1 elements,
// the largest dividing W (a row then starts on a VE boundary).
#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float silu_bf16(__nv_bfloat16 h) {
    const float v = __bfloat162float(h);
    return __bfloat162float(__float2bfloat16_rn(__fdividef(v, 1.f + __expf(-v))));
}

template <int VE>
struct Vec;
template <> struct Vec<8> { using T = uint4; };
template <> struct Vec<4> { using T = uint2; };
template <> struct Vec<2> { using T = unsigned int; };
template <> struct Vec<1> { using T = unsigned short; };

template <int VE>
__global__ void silu_rowmax_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                   int64_t rows, int W, int R) {
    using V = typename Vec<VE>::T;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    V* tile = reinterpret_cast<V*>(smem_raw);
    const int nv_row = W / VE;
    for (int64_t row0 = (int64_t)blockIdx.x * R; row0 < rows; row0 += (int64_t)gridDim.x * R) {
        const int nr = (int)std::min<int64_t>(R, rows - row0);
        const int nvec = nr * nv_row;
        const V* src = reinterpret_cast<const V*>(x + row0 * W);
        V* dst = reinterpret_cast<V*>(out + row0 * W);
        // 8 loads in flight per thread before any shared-memory store (a plain copy loop waits on each load)
        for (int base = 0; base < nvec; base += 8 * blockDim.x) {
            V tmp[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = base + u * blockDim.x + threadIdx.x;
                if (i < nvec) tmp[u] = __ldcs(src + i);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = base + u * blockDim.x + threadIdx.x;
                if (i < nvec) tile[i] = tmp[u];
            }
        }
        __syncthreads();
        for (int r = threadIdx.x; r < nr; r += blockDim.x) {
            V* rv = tile + r * nv_row;
            float m = -INFINITY;
            for (int j = 0; j < nv_row; ++j) {  // silu once, kept as bf16 in the tile
                V v = rv[j];
                __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
                for (int u = 0; u < VE; ++u) {
                    const float s = silu_bf16(h[u]);
                    m = fmaxf(m, s);
                    h[u] = __float2bfloat16_rn(s);
                }
                rv[j] = v;
            }
            for (int j = 0; j < nv_row; ++j) {
                V v = rv[j];
                __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
                for (int u = 0; u < VE; ++u) h[u] = __float2bfloat16_rn(__bfloat162float(h[u]) - m);
                rv[j] = v;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) __stcs(dst + i, tile[i]);
        __syncthreads();
    }
}

template <int VE>
static void launch(const torch::Tensor& x, torch::Tensor& out, int64_t rows, int W) {
    const int threads = 256;
    // rows per tile: one per thread, fewer when a row is long (tile <= 48 KB), a multiple of 8 so tiles stay aligned
    int R = std::min<int64_t>(256, std::max<int64_t>(8, (48 * 1024 / (2 * (int64_t)W)) / 8 * 8));
    const size_t smem = (size_t)R * W * 2;
    if (smem > 48 * 1024)
        C10_CUDA_CHECK(cudaFuncSetAttribute(silu_rowmax_kernel<VE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = (int)std::min<int64_t>((rows + R - 1) / R, (int64_t)sms * 8);
    silu_rowmax_kernel<VE><<<blocks, threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), rows, W, R);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor silu_sub_rowmax(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() >= 1, "x: bfloat16 CUDA tensor expected");
    auto out = torch::empty_like(x);
    const int W = (int)x.size(-1);
    if (x.numel() == 0) return out;
    TORCH_CHECK(W <= 16384, "silu_sub_rowmax: last dimension at most 16384");
    const int64_t rows = x.numel() / W;
    const bool a16 = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
    if (a16 && W % 8 == 0) launch<8>(x, out, rows, W);
    else if (a16 && W % 4 == 0) launch<4>(x, out, rows, W);
    else if (a16 && W % 2 == 0) launch<2>(x, out, rows, W);
    else launch<1>(x, out, rows, W);
    return out;
}
OPFORGE_EXPORT(silu_sub_rowmax, "silu(x) - amax(silu(x), dim=-1, keepdim=True), bfloat16, one kernel");
