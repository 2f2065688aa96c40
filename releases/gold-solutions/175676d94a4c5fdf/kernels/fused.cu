// CaiT talking-heads attention output: v3 = (x.permute(0,3,1,2) @ y).transpose(1,2).reshape(B, T, H*D);
// out = z + gamma * proj(v3), float16.
// Design: (1) one tensor-core kernel (WMMA 16x16x16, fp32 accumulate) computes v3 directly in (B, T, H*D)
// layout: a block owns (image, 32 query rows) and walks the key axis in chunks of 32; it loads x with 16-byte
// loads in its native (i, j, h) order and de-interleaves the 4 heads into shared memory on the way (the permute
// is fused into the load), loads the matching y rows, and each warp accumulates a (head, 16 rows) x 48 tile; the
// transpose / reshape is fused into the store. (2) cuBLASLt computes v4 = v3 Wp^T + b with the bias epilogue
// (fp32 accumulate, one fp16 rounding: the reference's addmm). (3) a 16-byte-vector kernel writes
// out = fp16(z + fp16(gamma * v4)) in place, rounding after each op as the reference does.
// Numerics: folding gamma into an fp16 copy of Wp (the first design) rounds every weight product to fp16; summed
// over 192 channels that put the output up to 1.24 x the tolerance away from the reference, so gamma is applied
// in the epilogue kernel instead (CPU emulation: max 0.80 -> 0.38 x tolerance at B = 32).
// Bytes (B = 256): x 78.7 MB, y 19.3 MB (re-read per row block from L2), v3 19.3 MB written + read, v4 19.3 MB
// written + read, z 19.3 MB, out 19.3 MB -> about 50 us on an H200 (roofline_ms 0.028, compile_ms 0.150).
#include "lib.cuh"
#include <mma.h>

using namespace nvcuda;
typedef __half f16;

constexpr int NH = 4, HDIM = 48, TI = 32, TJ = 32, XLD = 40, YLD = 56, CLD = NH * HDIM + 4;
constexpr int XS_BYTES = NH * TI * XLD * 2, YS_BYTES = NH * TJ * YLD * 2, CS_BYTES = TI * CLD * 4;
constexpr int SMEM_BYTES = (XS_BYTES + YS_BYTES) > CS_BYTES ? (XS_BYTES + YS_BYTES) : CS_BYTES;

__global__ void __launch_bounds__(256) heads_av(const f16* __restrict__ x, const f16* __restrict__ y,
                                                f16* __restrict__ v3, int T) {
    __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
    f16* Xs = reinterpret_cast<f16*>(smem);
    f16* Ys = reinterpret_cast<f16*>(smem + XS_BYTES);
    float* Cs = reinterpret_cast<float*>(smem);
    const int64_t b = blockIdx.y;
    const int i0 = blockIdx.x * TI;
    const int tid = threadIdx.x, warp = tid / 32, h = warp / 2, mt = warp % 2;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[3];
#pragma unroll
    for (int n = 0; n < 3; ++n) wmma::fill_fragment(acc[n], 0.f);
    const f16* xb = x + b * T * T * NH;
    const f16* yb = y + b * NH * T * HDIM;
    for (int j0 = 0; j0 < T; j0 += TJ) {
        for (int idx = tid; idx < TI * (TJ / 2); idx += blockDim.x) {
            const int r = idx / (TJ / 2), q = idx % (TJ / 2);
            const int i = i0 + r, j = j0 + 2 * q;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (i < T && j < T) v = *reinterpret_cast<const uint4*>(xb + ((int64_t)i * T + j) * NH);
            const f16* hv = reinterpret_cast<const f16*>(&v);
#pragma unroll
            for (int hh = 0; hh < NH; ++hh) {
                Xs[(hh * TI + r) * XLD + 2 * q] = hv[hh];
                Xs[(hh * TI + r) * XLD + 2 * q + 1] = hv[NH + hh];
            }
        }
        for (int idx = tid; idx < NH * TJ * (HDIM / 8); idx += blockDim.x) {
            const int hh = idx / (TJ * (HDIM / 8)), rem = idx % (TJ * (HDIM / 8));
            const int jj = rem / (HDIM / 8), q = rem % (HDIM / 8);
            const int j = j0 + jj;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (j < T) v = *reinterpret_cast<const uint4*>(yb + ((int64_t)hh * T + j) * HDIM + q * 8);
            *reinterpret_cast<uint4*>(Ys + (hh * TJ + jj) * YLD + q * 8) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TJ / 16; ++kk) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, f16, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Xs + (h * TI + mt * 16) * XLD + kk * 16, XLD);
#pragma unroll
            for (int n = 0; n < 3; ++n) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, f16, wmma::row_major> fb;
                wmma::load_matrix_sync(fb, Ys + (h * TJ + kk * 16) * YLD + n * 16, YLD);
                wmma::mma_sync(acc[n], fa, fb, acc[n]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < 3; ++n)
        wmma::store_matrix_sync(Cs + (mt * 16) * CLD + h * HDIM + n * 16, acc[n], CLD, wmma::mem_row_major);
    __syncthreads();
    constexpr int C = NH * HDIM;
    for (int idx = tid; idx < TI * (C / 8); idx += blockDim.x) {
        const int r = idx / (C / 8), q = idx % (C / 8);
        const int i = i0 + r;
        if (i >= T) continue;
        uint4 o;
        __half2* o2 = reinterpret_cast<__half2*>(&o);
        const float* src = Cs + r * CLD + q * 8;
#pragma unroll
        for (int k = 0; k < 4; ++k) o2[k] = __floats2half2_rn(src[2 * k], src[2 * k + 1]);
        *reinterpret_cast<uint4*>(v3 + (b * T + i) * C + q * 8) = o;
    }
}

// out = fp16(z + fp16(gamma[o] * v4)) in place over (B*T, O), 8 channels per step when O % 8 == 0
__global__ void gamma_residual(f16* out, const f16* __restrict__ z, const f16* __restrict__ gamma, int64_t total, int O,
                               bool vec) {
    if (vec) {
        const int64_t n8 = total / 8;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
            const int o0 = (int)((i * 8) % O);
            uint4 vr = reinterpret_cast<const uint4*>(out)[i], zr = reinterpret_cast<const uint4*>(z)[i], r;
            const f16* vp = reinterpret_cast<const f16*>(&vr);
            const f16* zp = reinterpret_cast<const f16*>(&zr);
            f16* op = reinterpret_cast<f16*>(&r);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const float v5 = __half2float(__float2half_rn(__fmul_rn(__half2float(gamma[o0 + q]), __half2float(vp[q]))));
                op[q] = __float2half_rn(__fadd_rn(__half2float(zp[q]), v5));
            }
            reinterpret_cast<uint4*>(out)[i] = r;
        }
    } else {
        for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
            const float v5 = __half2float(__float2half_rn(__fmul_rn(__half2float(gamma[e % O]), __half2float(out[e]))));
            out[e] = __float2half_rn(__fadd_rn(__half2float(z[e]), v5));
        }
    }
}

torch::Tensor talking_heads_out(torch::Tensor x, torch::Tensor y, torch::Tensor z, torch::Tensor wp, torch::Tensor bp,
                                torch::Tensor gamma) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf && x.dim() == 4, "x: float16 CUDA (B, T, T, H) expected");
    x = x.contiguous(); y = y.contiguous(); z = z.contiguous(); wp = wp.contiguous(); bp = bp.contiguous();
    gamma = gamma.contiguous();
    const int64_t B = x.size(0), T = x.size(1);
    TORCH_CHECK(x.size(2) == T && x.size(3) == NH && y.size(1) == NH && y.size(2) == T && y.size(3) == HDIM,
                "x (B, T, T, 4) and y (B, 4, T, 48) expected");
    TORCH_CHECK(T % 2 == 0, "T must be even");
    const int64_t C = NH * HDIM, O = wp.size(0);
    TORCH_CHECK(wp.size(1) == C && z.numel() == B * T * O, "proj / z shapes");
    auto out = torch::empty({B, T, O}, z.options());
    if (B == 0) return out;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    auto v3 = torch::empty({B, T, C}, x.options());
    heads_av<<<dim3((unsigned)((T + TI - 1) / TI), (unsigned)B), 256, 0, stream>>>(
        (const f16*)x.data_ptr(), (const f16*)y.data_ptr(), (f16*)v3.data_ptr(), (int)T);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // column-major: v4^T (O x B*T) = Wp (O x C) * v3^T (C x B*T) + b, written into out
    LtArgs a;
    a.ab_type = a.cd_type = CUDA_R_16F;
    a.transa = true; a.m = O; a.n = B * T; a.k = C;
    a.A = wp.data_ptr(); a.lda = C; a.B = v3.data_ptr(); a.ldb = C;
    a.D = out.data_ptr(); a.ldd = O;
    a.epilogue = CUBLASLT_EPILOGUE_BIAS; a.bias = bp.data_ptr();
    lt_matmul(a, x.device(), stream);
    const int64_t total = out.numel();
    const bool vec = O % 8 == 0 && reinterpret_cast<uintptr_t>(z.data_ptr()) % 16 == 0;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    gamma_residual<<<(unsigned)std::min<int64_t>((total / (vec ? 8 : 1) + 255) / 256, sms * 16), 256, 0, stream>>>(
        (f16*)out.data_ptr(), (const f16*)z.data_ptr(), (const f16*)gamma.data_ptr(), total, (int)O, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
