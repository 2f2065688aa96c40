// cuDNN forward convolution (NCHW or NHWC, one handle per device, algorithm chosen once per shape by
// cudnnFindConvolutionForwardAlgorithm and cached; the heuristic choice while a CUDA graph is being captured).
#pragma once
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cudnn.h>
#include <map>
#include <vector>

#define DNN_CHECK(expr)                                                                                  \
    do {                                                                                                 \
        cudnnStatus_t st_ = (expr);                                                                      \
        TORCH_CHECK(st_ == CUDNN_STATUS_SUCCESS, "cuDNN call failed: ", cudnnGetErrorString(st_), ": " #expr); \
    } while (0)

static inline cudnnHandle_t dnn_handle() {
    static cudnnHandle_t handles[64] = {};
    int dev = 0;
    cudaGetDevice(&dev);
    if (!handles[dev]) DNN_CHECK(cudnnCreate(&handles[dev]));
    return handles[dev];
}

// y = conv2d(x, w), stride / padding symmetric, no bias. NCHW: x (N, C, H, W), w (K, C, R, S), y (N, K, OH, OW);
// nhwc: the same logical sizes stored channels-last: x (N, H, W, C), w (K, R, S, C), y (N, OH, OW, K).
static inline void dnn_conv_forward(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y, int pad, int stride,
                                    cudnnDataType_t dtype, cudaStream_t stream, bool nhwc = false) {
    cudnnHandle_t h = dnn_handle();
    DNN_CHECK(cudnnSetStream(h, stream));
    const int N = x.size(0), C = nhwc ? x.size(3) : x.size(1), H = nhwc ? x.size(1) : x.size(2), W = nhwc ? x.size(2) : x.size(3);
    const int K = w.size(0), R = nhwc ? w.size(1) : w.size(2), S = nhwc ? w.size(2) : w.size(3);
    const int OH = nhwc ? y.size(1) : y.size(2), OW = nhwc ? y.size(2) : y.size(3);
    const cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    DNN_CHECK(cudnnCreateTensorDescriptor(&xd));
    DNN_CHECK(cudnnCreateTensorDescriptor(&yd));
    DNN_CHECK(cudnnCreateFilterDescriptor(&wd));
    DNN_CHECK(cudnnCreateConvolutionDescriptor(&cd));
    DNN_CHECK(cudnnSetTensor4dDescriptor(xd, fmt, dtype, N, C, H, W));
    DNN_CHECK(cudnnSetFilter4dDescriptor(wd, dtype, fmt, K, C, R, S));
    DNN_CHECK(cudnnSetConvolution2dDescriptor(cd, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN_CHECK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
    DNN_CHECK(cudnnSetTensor4dDescriptor(yd, fmt, dtype, N, K, OH, OW));
    static std::map<std::vector<int>, std::pair<cudnnConvolutionFwdAlgo_t, size_t>> cache;
    std::vector<int> key = {x.get_device(), (int)dtype, (int)nhwc, N, C, H, W, K, R, S, pad, stride};
    auto it = cache.find(key);
    cudnnConvolutionFwdAlgo_t algo;
    size_t ws_size = 0;
    const size_t ws_limit = (size_t)512 << 20;
    if (it != cache.end()) {
        algo = it->second.first;
        ws_size = it->second.second;
    } else {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(stream, &cap);
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int found = 0;
        if (cap == cudaStreamCaptureStatusNone)
            DNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
        else
            DNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
        int pick = -1;
        for (int i = 0; i < found; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_limit) { pick = i; break; }
        TORCH_CHECK(pick >= 0, "cuDNN found no convolution algorithm");
        algo = perf[pick].algo;
        ws_size = perf[pick].memory;
        if (cap == cudaStreamCaptureStatusNone) cache[key] = {algo, ws_size};
    }
    auto ws = torch::empty({(int64_t)ws_size + 1}, x.options().dtype(torch::kUInt8));
    const float alpha = 1.f, beta = 0.f;
    DNN_CHECK(cudnnConvolutionForward(h, &alpha, xd, x.data_ptr(), wd, w.data_ptr(), cd, algo, ws.data_ptr(), ws_size,
                                      &beta, yd, y.data_ptr()));
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
}
