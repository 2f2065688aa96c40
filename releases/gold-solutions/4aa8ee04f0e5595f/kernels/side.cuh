// A second CUDA stream per device for work that overlaps a GEMM (memory-bound passes beside a compute-bound
// GEMM), with events to fork from and join back into the current stream. It works under CUDA graph capture
// (fork / join by event record + wait); every launch on it is joined back before the function returns, so the
// caching allocator never reuses memory the side stream still reads.
#pragma once
#include <ATen/cuda/CUDAContext.h>

struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t events[16] = {};
};

static inline SideStream& side_stream() {
    static SideStream per_device[64];
    int dev = 0;
    cudaGetDevice(&dev);
    SideStream& s = per_device[dev];
    if (!s.stream) {
        C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
        for (auto& e : s.events) C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    return s;
}

// `to` waits for everything enqueued so far on `from`, using event slot `slot`
static inline void stream_wait(cudaStream_t to, cudaStream_t from, int slot) {
    SideStream& s = side_stream();
    C10_CUDA_CHECK(cudaEventRecord(s.events[slot], from));
    C10_CUDA_CHECK(cudaStreamWaitEvent(to, s.events[slot], 0));
}
