// opforge harness: the boundary between kernel sources built against the light headers (opforge_lite.h) and
// the fixed binding unit (lite_binding.cpp), which holds the real torch. Plain C++ types only: a tensor is
// its c10::TensorImpl* (void*), owned by the caller of the function that returned it (one reference).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace opforge_lite_abi {
// references
void incref(void* t);
void decref(void* t);
// metadata (t is never null here)
void* data_ptr(void* t);
int64_t dim(void* t);
const int64_t* sizes(void* t);
const int64_t* strides(void* t);
int64_t numel(void* t);
int64_t storage_offset(void* t);
int scalar_type(void* t);
int device_type(void* t);
int device_index(void* t);
bool is_contiguous(void* t);
const char* scalar_type_name(int scalar_type);
// allocation, views, copies, conversions: each returns a new reference (the ops of harness.guard.ALLOWED_ATEN)
void* empty(const int64_t* shape, size_t n, int scalar_type, int device_type, int device_index);
void* empty_strided(const int64_t* shape, const int64_t* strides, size_t n, int scalar_type, int device_type,
                    int device_index);
void* zeros(const int64_t* shape, size_t n, int scalar_type, int device_type, int device_index);
void* empty_like(void* t, int scalar_type, int device_type, int device_index);  // -1: as t
void* zeros_like(void* t, int scalar_type, int device_type, int device_index);
void* contiguous(void* t);
void* clone(void* t);
void* to(void* t, int scalar_type, int device_type, int device_index);           // -1: as t
void* view(void* t, const int64_t* shape, size_t n);
void* reshape(void* t, const int64_t* shape, size_t n);
void* transpose(void* t, int64_t a, int64_t b);
void* permute(void* t, const int64_t* dims, size_t n);
void* narrow(void* t, int64_t dim, int64_t start, int64_t length);
void* select(void* t, int64_t dim, int64_t index);
void* unsqueeze(void* t, int64_t dim);
void* squeeze(void* t, int64_t dim);
void* expand(void* t, const int64_t* shape, size_t n);
void* flatten(void* t, int64_t start, int64_t end);
void zero_(void* t);
void fill_(void* t, double value);
void copy_(void* t, void* src);
// CUDA (a build without CUDA throws)
void* current_stream(int device);  // cudaStream_t of the current stream of `device` (-1: the current device)
int current_device();
const void* device_properties(int device);  // cudaDeviceProp*, cached by torch
// errors: throws the error torch's TORCH_CHECK throws (a RuntimeError in Python)
[[noreturn]] void fail(const char* message);

// OPFORGE_EXPORT: one entry per registered function; the binding unit makes each a Python function
enum Kind : int {
    KIND_VOID = 0, KIND_TENSOR = 1, KIND_OPT_TENSOR = 2, KIND_TENSOR_LIST = 3, KIND_INT = 4, KIND_DOUBLE = 5,
    KIND_BOOL = 6, KIND_INT_LIST = 7, KIND_TUPLE = 8,
};
struct ArgC {              // one argument, borrowed for the call
    void* tensor;          // KIND_TENSOR, KIND_OPT_TENSOR (null: None)
    void* const* tensors;  // KIND_TENSOR_LIST (n of them)
    const int64_t* ints;   // KIND_INT_LIST (n of them)
    size_t n;
    int64_t i;             // KIND_INT, KIND_BOOL
    double d;              // KIND_DOUBLE
};
struct RetC {                    // the result
    std::vector<void*> tensors;  // KIND_TENSOR (one), KIND_TENSOR_LIST, KIND_TUPLE: new references
    int64_t i = 0;
    double d = 0.0;
};
using Thunk = void (*)(void (*fn)(), const ArgC* args, RetC* ret);
struct ExportEntry {
    const char* name;
    const char* doc;
    void (*fn)();
    Thunk call;
    size_t nargs;
    const int* kinds;  // nargs kinds
    int ret_kind;
};
void add_export(const ExportEntry* entry);  // called by static initialisers, before the module is made
}  // namespace opforge_lite_abi
