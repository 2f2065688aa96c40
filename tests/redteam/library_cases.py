"""Red-team cases of the library policy (``harness.libraries``, issue #57): the task of ``solutions.py``
(``relu(x * scale + 1)``, x float32 (64, 256)) computed through a library, allowed or not.

``LIBRARY_HONEST``: the GEMM through cuBLAS (``cublasSgemm`` of x with diag(scale), built by our own kernel) and
the convolution through cuDNN (a depthwise 1x1 ``cudnnConvolutionForward``), each followed by our own
``+ 1, ReLU`` kernel: allowed, must be accepted. ``LIBRARY_HACKS``: name -> (files, the source token the
audit must name): a non-GEMM cuBLAS routine (``cublasSdgmm``), a non-convolution cuDNN routine
(``cudnnActivationForward``), cuSPARSE, cuRAND's device API, cuFFT, torch's cuBLAS handle, Thrust.
Every source compiles with nvcc 13 and the CUDA torch headers; the allowed ones need the build to link
``-lcublas`` / ``-lcudnn`` (``harness.libraries.build_options``).
"""

from __future__ import annotations

from .solutions import model_new

_HEAD = r'''#include "registry.h"
#include <ATen/cuda/CUDAContext.h>
'''

# y = max(y + 1, 0) in place, and the diagonal matrix of s
_OWN = r'''
__global__ void add_one_relu(float* y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = y[i] + 1.0f;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void diagonal(const float* s, float* d, int64_t c) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < c * c) d[i] = (i / c == i % c) ? s[i / c] : 0.0f;
}

static void finish(torch::Tensor& y, cudaStream_t stream) {
    const int64_t n = y.numel();
    add_one_relu<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
'''

CUBLAS_GEMM = _HEAD + "#include <cublas_v2.h>\n" + _OWN + r'''
static cublasHandle_t blas() {
    static cublasHandle_t h = nullptr;
    if (h == nullptr) TORCH_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    return h;
}

// row-major Y (rows x c) = X (rows x c) D (c x c), D = diag(scale): column-major Y^T = D X^T
torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto sc = scale.contiguous();
    const int64_t c = sc.numel(), rows = xc.numel() / c;
    auto d = torch::empty({c, c}, xc.options());
    auto y = torch::empty_like(xc);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    diagonal<<<(unsigned)((c * c + 255) / 256), 256, 0, stream>>>(sc.data_ptr<float>(), d.data_ptr<float>(), c);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cublasHandle_t h = blas();
    TORCH_CHECK(cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed");
    const float one = 1.0f, zero = 0.0f;
    TORCH_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)c, (int)rows, (int)c, &one, d.data_ptr<float>(),
                            (int)c, xc.data_ptr<float>(), (int)c, &zero, y.data_ptr<float>(), (int)c)
                == CUBLAS_STATUS_SUCCESS, "cublasSgemm failed");
    finish(y, stream);
    return y;
}
OPFORGE_EXPORT(fused_scale_relu, "relu(x diag(scale) + 1): cuBLAS GEMM, own epilogue");
'''

CUDNN_CONV = _HEAD + "#include <cudnn.h>\n" + _OWN + r'''
#define CHECK_DNN(call) TORCH_CHECK((call) == CUDNN_STATUS_SUCCESS, #call " failed")

static cudnnHandle_t dnn() {
    static cudnnHandle_t h = nullptr;
    if (h == nullptr) CHECK_DNN(cudnnCreate(&h));
    return h;
}

// x (rows, c) as NCHW (rows, c, 1, 1); a depthwise 1x1 convolution with weights scale (c, 1, 1, 1)
torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto sc = scale.contiguous();
    const int c = (int)sc.numel(), rows = (int)(xc.numel() / sc.numel());
    auto y = torch::empty_like(xc);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    cudnnHandle_t h = dnn();
    CHECK_DNN(cudnnSetStream(h, stream));
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    CHECK_DNN(cudnnCreateTensorDescriptor(&xd));
    CHECK_DNN(cudnnCreateTensorDescriptor(&yd));
    CHECK_DNN(cudnnCreateFilterDescriptor(&wd));
    CHECK_DNN(cudnnCreateConvolutionDescriptor(&cd));
    CHECK_DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, rows, c, 1, 1));
    CHECK_DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, rows, c, 1, 1));
    CHECK_DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, c, 1, 1, 1));
    CHECK_DNN(cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CHECK_DNN(cudnnSetConvolutionGroupCount(cd, c));
    CHECK_DNN(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int found = 0;
    CHECK_DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8, &found, perf));
    TORCH_CHECK(found > 0, "no cuDNN algorithm");
    size_t bytes = 0;
    CHECK_DNN(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, perf[0].algo, &bytes));
    auto ws = torch::empty({(int64_t)bytes + 1}, xc.options().dtype(torch::kUInt8));
    const float one = 1.0f, zero = 0.0f;
    CHECK_DNN(cudnnConvolutionForward(h, &one, xd, xc.data_ptr<float>(), wd, sc.data_ptr<float>(), cd,
                                      perf[0].algo, ws.data_ptr(), bytes, &zero, yd, y.data_ptr<float>()));
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    finish(y, stream);
    return y;
}
OPFORGE_EXPORT(fused_scale_relu, "relu(depthwise 1x1 conv(x, scale) + 1): cuDNN convolution, own epilogue");
'''

# x * diag(scale) by cuBLAS's dgmm: a BLAS routine outside the GEMM family
CUBLAS_DGMM = _HEAD + "#include <cublas_v2.h>\n" + _OWN + r'''
torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto sc = scale.contiguous();
    const int64_t c = sc.numel(), rows = xc.numel() / c;
    auto y = torch::empty_like(xc);
    static cublasHandle_t h = nullptr;
    if (h == nullptr) cublasCreate(&h);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    cublasSetStream(h, stream);
    cublasSdgmm(h, CUBLAS_SIDE_LEFT, (int)c, (int)rows, xc.data_ptr<float>(), (int)c, sc.data_ptr<float>(), 1,
                y.data_ptr<float>(), (int)c);
    finish(y, stream);
    return y;
}
OPFORGE_EXPORT(fused_scale_relu, "cheat: cuBLAS dgmm");
'''

# the ReLU by cuDNN's standalone activation: a cuDNN routine outside the convolution family
CUDNN_ACTIVATION = _HEAD + "#include <cudnn.h>\n" + r'''
__global__ void scale_add(const float* x, const float* s, float* y, int64_t n, int64_t c) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s[i % c] + 1.0f;
}

torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto sc = scale.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel(), c = sc.numel();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    scale_add<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(xc.data_ptr<float>(), sc.data_ptr<float>(),
                                                              y.data_ptr<float>(), n, c);
    static cudnnHandle_t h = nullptr;
    if (h == nullptr) cudnnCreate(&h);
    cudnnSetStream(h, stream);
    cudnnTensorDescriptor_t d;
    cudnnActivationDescriptor_t a;
    cudnnCreateTensorDescriptor(&d);
    cudnnCreateActivationDescriptor(&a);
    cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, (int)n);
    cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    const float one = 1.0f, zero = 0.0f;
    cudnnActivationForward(h, a, &one, d, y.data_ptr<float>(), &zero, d, y.data_ptr<float>());
    return y;
}
OPFORGE_EXPORT(fused_scale_relu, "cheat: cuDNN activation");
'''

# a cuSPARSE handle (any use of a library outside cuBLAS / cuDNN)
CUSPARSE = CUBLAS_GEMM.replace("#include <cublas_v2.h>\n", "#include <cublas_v2.h>\n#include <cusparse.h>\n").replace(
    "    finish(y, stream);\n", "    static cusparseHandle_t sp = nullptr;\n    if (sp == nullptr) cusparseCreate(&sp);\n"
    "    finish(y, stream);\n", 1)

# cuRAND's device API (header-only: no imported symbol; the sources are audited)
CURAND_DEVICE = CUBLAS_GEMM.replace("#include <cublas_v2.h>\n", "#include <cublas_v2.h>\n#include <curand_kernel.h>\n"
                                    ).replace("static cublasHandle_t blas()", r'''__global__ void noise(float* y, int64_t n) {
    curandStatePhilox4_32_10_t st;
    curand_init(0, 0, 0, &st);
    if (n > 0) y[0] += 0.0f * curand_uniform(&st);
}

static cublasHandle_t blas()''', 1)

# cuFFT, torch's own cuBLAS handle, Thrust: declared by hand, no header
CUFFT_BY_HAND = _HEAD + r'''
extern "C" int cufftPlan1d(int* plan, int nx, int type, int batch);
torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) { int p; cufftPlan1d(&p, 8, 0x2a, 1); return x; }
OPFORGE_EXPORT(fused_scale_relu, "cheat: cuFFT");
'''
TORCH_BLAS_HANDLE = CUBLAS_GEMM.replace("cublasHandle_t h = blas();", "cublasHandle_t h = at::cuda::getCurrentCUDABlasHandle();")
THRUST = _HEAD + "#include <thrust/transform.h>\n" + r'''
torch::Tensor fused_scale_relu(torch::Tensor x, torch::Tensor scale) { return x; }
OPFORGE_EXPORT(fused_scale_relu, "cheat: thrust");
'''

LIBRARY_HONEST = {
    "cublas_gemm": {"model_new.py": model_new(), "kernels/gemm.cu": CUBLAS_GEMM},
    "cudnn_conv": {"model_new.py": model_new(), "kernels/conv.cu": CUDNN_CONV},
}
LIBRARY_HACKS = {
    "cublas_dgmm": ({"model_new.py": model_new(), "kernels/dgmm.cu": CUBLAS_DGMM}, "cublasSdgmm"),
    "cudnn_activation": ({"model_new.py": model_new(), "kernels/act.cu": CUDNN_ACTIVATION}, "cudnnActivationForward"),
    "cusparse_handle": ({"model_new.py": model_new(), "kernels/sp.cu": CUSPARSE}, "cusparseCreate"),
    "curand_device_api": ({"model_new.py": model_new(), "kernels/rng.cu": CURAND_DEVICE}, "curand_init"),
    "cufft_declared_by_hand": ({"model_new.py": model_new(), "kernels/fft.cu": CUFFT_BY_HAND}, "cufftPlan1d"),
    "torch_cublas_handle": ({"model_new.py": model_new(), "kernels/gemm.cu": TORCH_BLAS_HANDLE}, "getCurrentCUDABlas"),
    "thrust": ({"model_new.py": model_new(), "kernels/thrust.cu": THRUST}, "#include thrust/"),
}
# the symbols each kind of extension imports (nm -D --undefined-only -C of a build with torch 2.11 / CUDA 13)
ALLOWED_SYMBOLS = ["cublasCreate_v2@libcublas.so.13", "cublasSetStream_v2@libcublas.so.13",
                   "cublasSgemm_v2@libcublas.so.13", "cublasGemmEx@libcublas.so.13",
                   "cublasGemmStridedBatchedEx@libcublas.so.13", "cublasLtMatmul@libcublasLt.so.13",
                   "cublasLtMatmulDescSetAttribute@libcublasLt.so.13", "cudnnCreate@libcudnn.so.9",
                   "cudnnConvolutionForward@libcudnn.so.9", "cudnnConvolutionBiasActivationForward@libcudnn.so.9",
                   "cudnnBackendExecute@libcudnn.so.9", "cudnnGetConvolutionForwardWorkspaceSize@libcudnn.so.9"]
DENIED_SYMBOLS = ["cublasSdgmm@libcublas.so.13", "cublasSaxpy_v2@libcublas.so.13", "cublasSgeam@libcublas.so.13",
                  "cublasSgemv_v2@libcublas.so.13", "cublasLtMatrixTransform@libcublasLt.so.13",
                  "cudnnActivationForward@libcudnn.so.9", "cudnnSoftmaxForward@libcudnn.so.9",
                  "cudnnBatchNormalizationForwardInference@libcudnn.so.9", "cudnnAddTensor@libcudnn.so.9",
                  "cusparseCreate@libcusparse.so.12", "curandGenerateUniform@libcurand.so.10",
                  "cufftPlan1d@libcufft.so.12", "cusolverDnCreate@libcusolver.so.12", "ncclAllReduce@libnccl.so.2",
                  "cutensorContract", "nppiAdd_32f_C1R", "cublasXtSgemm@libcublas.so.13",
                  "at::cuda::getCurrentCUDABlasHandle()"]
