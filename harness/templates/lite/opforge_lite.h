// opforge harness: the light torch headers (do not edit). A solution's sources are first built against this
// file instead of torch's own headers: `#include <torch/extension.h>` (and the other names in this folder)
// resolve here, so a kernel source compiles in seconds instead of parsing torch for a minute. It declares
// the part of the torch C++ API a kernel extension uses to read tensors, allocate outputs and launch on the
// current CUDA stream; every call goes to the real torch in the harness's fixed binding unit
// (lite_binding.cpp), so it behaves as torch does. A source that needs anything else does not compile here
// and is built against the full torch headers instead (harness.child), with the same result.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge_lite_abi.h"
#ifdef OPFORGE_LITE_CUDA
#include <cuda_runtime.h>
#endif

namespace opforge_lite {
namespace abi = ::opforge_lite_abi;

// ---- errors ----------------------------------------------------------------------------------------------
inline void str_into(std::ostringstream&) {}
template <class T, class... R>
inline void str_into(std::ostringstream& os, const T& v, const R&... rest) {
    os << v;
    str_into(os, rest...);
}
template <class... A>
inline std::string str(const A&... args) {
    std::ostringstream os;
    str_into(os, args...);
    return os.str();
}
[[noreturn]] inline void check_fail(const char* file, int line, const char* cond, const std::string& msg) {
    abi::fail(str(msg.empty() ? std::string("Expected ") + cond + " to be true, but got false." : msg,
                  " (", file, ":", line, ")").c_str());
}

// ---- scalar types, devices -------------------------------------------------------------------------------
enum class ScalarType : int8_t {
    Byte = 0, Char = 1, Short = 2, Int = 3, Long = 4, Half = 5, Float = 6, Double = 7, ComplexHalf = 8,
    ComplexFloat = 9, ComplexDouble = 10, Bool = 11, QInt8 = 12, QUInt8 = 13, QInt32 = 14, BFloat16 = 15,
    Undefined = -1,
};
inline const char* toString(ScalarType t) { return abi::scalar_type_name(static_cast<int>(t)); }
inline std::ostream& operator<<(std::ostream& os, ScalarType t) { return os << toString(t); }
inline size_t elementSize(ScalarType t) {
    switch (t) {
        case ScalarType::Byte: case ScalarType::Char: case ScalarType::Bool: return 1;
        case ScalarType::Short: case ScalarType::Half: case ScalarType::BFloat16: return 2;
        case ScalarType::Int: case ScalarType::Float: return 4;
        case ScalarType::Long: case ScalarType::Double: case ScalarType::ComplexFloat: return 8;
        case ScalarType::ComplexDouble: return 16;
        default: abi::fail("elementSize: unsupported scalar type");
    }
}
// fp16 / bf16 storage types: 2 bytes, no arithmetic here (reinterpret their data as __half / __nv_bfloat16)
struct alignas(2) Half { uint16_t x; };
struct alignas(2) BFloat16 { uint16_t x; };

template <class T> struct ScalarTypeOf;
#define OPFORGE_LITE_ST(T, N) template <> struct ScalarTypeOf<T> { static constexpr ScalarType value = ScalarType::N; };
OPFORGE_LITE_ST(uint8_t, Byte)
OPFORGE_LITE_ST(int8_t, Char)
OPFORGE_LITE_ST(int16_t, Short)
OPFORGE_LITE_ST(int32_t, Int)
OPFORGE_LITE_ST(int64_t, Long)
OPFORGE_LITE_ST(Half, Half)
OPFORGE_LITE_ST(float, Float)
OPFORGE_LITE_ST(double, Double)
OPFORGE_LITE_ST(bool, Bool)
OPFORGE_LITE_ST(BFloat16, BFloat16)
#undef OPFORGE_LITE_ST

template <ScalarType S> struct CppTypeOf;
#define OPFORGE_LITE_CT(T, N) template <> struct CppTypeOf<ScalarType::N> { using type = T; };
OPFORGE_LITE_CT(uint8_t, Byte)
OPFORGE_LITE_CT(int8_t, Char)
OPFORGE_LITE_CT(int16_t, Short)
OPFORGE_LITE_CT(int32_t, Int)
OPFORGE_LITE_CT(int64_t, Long)
OPFORGE_LITE_CT(Half, Half)
OPFORGE_LITE_CT(float, Float)
OPFORGE_LITE_CT(double, Double)
OPFORGE_LITE_CT(bool, Bool)
OPFORGE_LITE_CT(BFloat16, BFloat16)
#undef OPFORGE_LITE_CT

constexpr ScalarType kByte = ScalarType::Byte, kUInt8 = ScalarType::Byte, kChar = ScalarType::Char,
                     kInt8 = ScalarType::Char, kShort = ScalarType::Short, kInt16 = ScalarType::Short,
                     kInt = ScalarType::Int, kInt32 = ScalarType::Int, kLong = ScalarType::Long,
                     kInt64 = ScalarType::Long, kHalf = ScalarType::Half, kFloat16 = ScalarType::Half,
                     kFloat = ScalarType::Float, kFloat32 = ScalarType::Float, kDouble = ScalarType::Double,
                     kFloat64 = ScalarType::Double, kBool = ScalarType::Bool, kBFloat16 = ScalarType::BFloat16;
using Dtype = ScalarType;

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
constexpr DeviceType kCPU = DeviceType::CPU, kCUDA = DeviceType::CUDA;
class Device {
   public:
    Device(DeviceType type, int index = -1) : type_(type), index_(static_cast<int8_t>(index)) {}
    DeviceType type() const { return type_; }
    int8_t index() const { return index_; }
    bool has_index() const { return index_ >= 0; }
    bool is_cuda() const { return type_ == DeviceType::CUDA; }
    bool is_cpu() const { return type_ == DeviceType::CPU; }
    bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
    bool operator!=(const Device& o) const { return !(*this == o); }
    std::string str() const { return str_of(); }

   private:
    std::string str_of() const {
        std::string s = is_cuda() ? "cuda" : "cpu";
        return has_index() ? s + ":" + std::to_string(index_) : s;
    }
    DeviceType type_;
    int8_t index_;
};
inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// ---- IntArrayRef (non-owning, as c10::ArrayRef<int64_t>) ----------------------------------------------------
class IntArrayRef {
   public:
    IntArrayRef() = default;
    IntArrayRef(const int64_t& one) : d_(&one), n_(1) {}
    IntArrayRef(const int64_t* d, size_t n) : d_(d), n_(n) {}
    IntArrayRef(const std::vector<int64_t>& v) : d_(v.data()), n_(v.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"  // as c10::ArrayRef: the list outlives the call it is passed to
#endif
    IntArrayRef(std::initializer_list<int64_t> l) : d_(l.begin()), n_(l.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    template <size_t N> IntArrayRef(const std::array<int64_t, N>& a) : d_(a.data()), n_(N) {}
    template <size_t N> IntArrayRef(const int64_t (&a)[N]) : d_(a), n_(N) {}
    const int64_t* data() const { return d_; }
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    const int64_t* begin() const { return d_; }
    const int64_t* end() const { return d_ + n_; }
    const int64_t& operator[](size_t i) const { return d_[i]; }
    const int64_t& at(size_t i) const {
        if (i >= n_) abi::fail("IntArrayRef::at: index out of range");
        return d_[i];
    }
    const int64_t& front() const { return at(0); }
    const int64_t& back() const { return at(n_ - 1); }
    std::vector<int64_t> vec() const { return std::vector<int64_t>(d_, d_ + n_); }
    bool equals(IntArrayRef o) const { return n_ == o.n_ && std::equal(begin(), end(), o.begin()); }
    bool operator==(IntArrayRef o) const { return equals(o); }
    bool operator!=(IntArrayRef o) const { return !equals(o); }

   private:
    const int64_t* d_ = nullptr;
    size_t n_ = 0;
};
inline std::ostream& operator<<(std::ostream& os, IntArrayRef a) {
    os << "[";
    for (size_t i = 0; i < a.size(); ++i) os << (i ? ", " : "") << a[i];
    return os << "]";
}

// ---- TensorOptions (dtype and device; unset fields: torch's defaults, or the source tensor's) --------------
class TensorOptions {
   public:
    TensorOptions() = default;
    TensorOptions(ScalarType t) : dtype_(static_cast<int>(t)) {}
    TensorOptions(Device d) : dev_type_(static_cast<int>(d.type())), dev_index_(d.index()) {}
    TensorOptions(DeviceType t) : dev_type_(static_cast<int>(t)) {}
    TensorOptions dtype(ScalarType t) const { TensorOptions o = *this; o.dtype_ = static_cast<int>(t); return o; }
    TensorOptions device(Device d) const {
        TensorOptions o = *this;
        o.dev_type_ = static_cast<int>(d.type());
        o.dev_index_ = d.index();
        return o;
    }
    TensorOptions device(DeviceType t, int index = -1) const { return device(Device(t, index)); }
    TensorOptions device_index(int index) const { return device(Device(DeviceType::CUDA, index)); }
    ScalarType dtype() const { return dtype_ < 0 ? ScalarType::Float : static_cast<ScalarType>(dtype_); }
    Device device() const {
        return dev_type_ < 0 ? Device(DeviceType::CPU) : Device(static_cast<DeviceType>(dev_type_), dev_index_);
    }
    bool has_dtype() const { return dtype_ >= 0; }
    bool has_device() const { return dev_type_ >= 0; }
    int raw_dtype() const { return dtype_; }
    int raw_device_type() const { return dev_type_; }
    int raw_device_index() const { return dev_index_; }

   private:
    int dtype_ = -1, dev_type_ = -1, dev_index_ = -1;
};
inline TensorOptions dtype(ScalarType t) { return TensorOptions().dtype(t); }
inline TensorOptions device(Device d) { return TensorOptions().device(d); }

// ---- Tensor: a reference to a real torch tensor ------------------------------------------------------------
class Tensor {
   public:
    Tensor() = default;
    Tensor(const Tensor& o) : p_(o.p_) {
        if (p_) abi::incref(p_);
    }
    Tensor(Tensor&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    Tensor& operator=(const Tensor& o) {
        if (o.p_) abi::incref(o.p_);
        if (p_) abi::decref(p_);
        p_ = o.p_;
        return *this;
    }
    Tensor& operator=(Tensor&& o) noexcept {
        std::swap(p_, o.p_);
        return *this;
    }
    ~Tensor() {
        if (p_) abi::decref(p_);
    }
    static Tensor adopt(void* p) {  // takes over one reference
        Tensor t;
        t.p_ = p;
        return t;
    }
    static Tensor borrow(void* p) {  // adds one reference
        if (p) abi::incref(p);
        return adopt(p);
    }
    void* lite_impl() const { return p_; }
    void* lite_release() {
        void* p = p_;
        p_ = nullptr;
        return p;
    }

    bool defined() const { return p_ != nullptr; }
    int64_t dim() const { return abi::dim(ok()); }
    int64_t ndimension() const { return dim(); }
    IntArrayRef sizes() const { return IntArrayRef(abi::sizes(ok()), static_cast<size_t>(dim())); }
    IntArrayRef strides() const { return IntArrayRef(abi::strides(ok()), static_cast<size_t>(dim())); }
    int64_t size(int64_t d) const { return sizes()[wrap(d)]; }
    int64_t stride(int64_t d) const { return strides()[wrap(d)]; }
    int64_t numel() const { return abi::numel(ok()); }
    int64_t storage_offset() const { return abi::storage_offset(ok()); }
    ScalarType scalar_type() const { return static_cast<ScalarType>(abi::scalar_type(ok())); }
    ScalarType dtype() const { return scalar_type(); }
    size_t element_size() const { return elementSize(scalar_type()); }
    size_t itemsize() const { return element_size(); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
    Device device() const { return Device(static_cast<DeviceType>(abi::device_type(ok())), abi::device_index(ok())); }
    bool is_cuda() const { return device().is_cuda(); }
    bool is_cpu() const { return device().is_cpu(); }
    int8_t get_device() const { return is_cuda() ? device().index() : static_cast<int8_t>(-1); }
    bool is_contiguous() const { return abi::is_contiguous(ok()); }
    TensorOptions options() const { return TensorOptions(scalar_type()).device(device()); }
    bool is_same(const Tensor& o) const { return p_ == o.p_; }

    void* data_ptr() const { return abi::data_ptr(ok()); }
    void* mutable_data_ptr() const { return data_ptr(); }
    const void* const_data_ptr() const { return data_ptr(); }
    template <class T> T* data_ptr() const {
        constexpr ScalarType want = ScalarTypeOf<std::remove_cv_t<T>>::value;
        if (scalar_type() != want)
            abi::fail(str("expected scalar type ", toString(want), " but found ", toString(scalar_type())).c_str());
        return static_cast<T*>(data_ptr());
    }
    template <class T> T* mutable_data_ptr() const { return data_ptr<T>(); }
    template <class T> const T* const_data_ptr() const { return data_ptr<std::remove_const_t<T>>(); }

    Tensor contiguous() const { return adopt(abi::contiguous(ok())); }
    Tensor clone() const { return adopt(abi::clone(ok())); }
    Tensor to(ScalarType t) const { return adopt(abi::to(ok(), static_cast<int>(t), -1, -1)); }
    Tensor to(Device d) const { return adopt(abi::to(ok(), -1, static_cast<int>(d.type()), d.index())); }
    Tensor to(Device d, ScalarType t) const {
        return adopt(abi::to(ok(), static_cast<int>(t), static_cast<int>(d.type()), d.index()));
    }
    Tensor to(const TensorOptions& o) const {
        return adopt(abi::to(ok(), o.raw_dtype(), o.raw_device_type(), o.raw_device_index()));
    }
    Tensor view(IntArrayRef s) const { return adopt(abi::view(ok(), s.data(), s.size())); }
    Tensor reshape(IntArrayRef s) const { return adopt(abi::reshape(ok(), s.data(), s.size())); }
    Tensor transpose(int64_t a, int64_t b) const { return adopt(abi::transpose(ok(), a, b)); }
    Tensor t() const { return transpose(0, 1); }
    Tensor permute(IntArrayRef d) const { return adopt(abi::permute(ok(), d.data(), d.size())); }
    Tensor narrow(int64_t d, int64_t start, int64_t len) const { return adopt(abi::narrow(ok(), d, start, len)); }
    Tensor select(int64_t d, int64_t i) const { return adopt(abi::select(ok(), d, i)); }
    Tensor unsqueeze(int64_t d) const { return adopt(abi::unsqueeze(ok(), d)); }
    Tensor squeeze(int64_t d) const { return adopt(abi::squeeze(ok(), d)); }
    Tensor expand(IntArrayRef s) const { return adopt(abi::expand(ok(), s.data(), s.size())); }
    Tensor flatten(int64_t start = 0, int64_t end = -1) const { return adopt(abi::flatten(ok(), start, end)); }
    Tensor view_as(const Tensor& o) const { return view(o.sizes()); }
    Tensor reshape_as(const Tensor& o) const { return reshape(o.sizes()); }
    const Tensor& zero_() const {
        abi::zero_(ok());
        return *this;
    }
    const Tensor& fill_(double v) const {
        abi::fill_(ok(), v);
        return *this;
    }
    const Tensor& copy_(const Tensor& src) const {
        abi::copy_(ok(), src.ok());
        return *this;
    }

   private:
    void* ok() const {
        if (!p_) abi::fail("the tensor is undefined");
        return p_;
    }
    size_t wrap(int64_t d) const {
        const int64_t n = dim();
        if (d < -n || d >= n) abi::fail(str("dimension ", d, " out of range for a ", n, "-d tensor").c_str());
        return static_cast<size_t>(d < 0 ? d + n : d);
    }
    void* p_ = nullptr;
};

// ---- factory functions ---------------------------------------------------------------------------------------
inline Tensor empty(IntArrayRef size, TensorOptions o = {}) {
    return Tensor::adopt(abi::empty(size.data(), size.size(), o.raw_dtype(), o.raw_device_type(), o.raw_device_index()));
}
inline Tensor zeros(IntArrayRef size, TensorOptions o = {}) {
    return Tensor::adopt(abi::zeros(size.data(), size.size(), o.raw_dtype(), o.raw_device_type(), o.raw_device_index()));
}
inline Tensor empty_strided(IntArrayRef size, IntArrayRef stride, TensorOptions o = {}) {
    if (size.size() != stride.size()) abi::fail("empty_strided: sizes and strides differ in length");
    return Tensor::adopt(abi::empty_strided(size.data(), stride.data(), size.size(), o.raw_dtype(),
                                            o.raw_device_type(), o.raw_device_index()));
}
inline Tensor empty_like(const Tensor& t, TensorOptions o = {}) {
    return Tensor::adopt(abi::empty_like(t.lite_impl(), o.raw_dtype(), o.raw_device_type(), o.raw_device_index()));
}
inline Tensor zeros_like(const Tensor& t, TensorOptions o = {}) {
    return Tensor::adopt(abi::zeros_like(t.lite_impl(), o.raw_dtype(), o.raw_device_type(), o.raw_device_index()));
}

inline std::optional<Device> device_of(const Tensor& t) {
    return t.defined() ? std::optional<Device>(t.device()) : std::nullopt;
}

// ---- CUDA: the current stream, device properties, device guards -------------------------------------------
#ifdef OPFORGE_LITE_CUDA
namespace cuda {
class CUDAStream {
   public:
    CUDAStream(cudaStream_t s, int device) : s_(s), device_(device) {}
    cudaStream_t stream() const { return s_; }
    operator cudaStream_t() const { return s_; }
    int8_t device_index() const { return static_cast<int8_t>(device_); }
    Device device() const { return Device(DeviceType::CUDA, device_); }

   private:
    cudaStream_t s_;
    int device_;
};
inline int current_device() { return abi::current_device(); }
inline CUDAStream getCurrentCUDAStream(int device = -1) {
    const int d = device < 0 ? current_device() : device;
    return CUDAStream(static_cast<cudaStream_t>(abi::current_stream(d)), d);
}
inline cudaDeviceProp* getDeviceProperties(int64_t device) {
    return static_cast<cudaDeviceProp*>(const_cast<void*>(abi::device_properties(static_cast<int>(device))));
}
inline cudaDeviceProp* getCurrentDeviceProperties() { return getDeviceProperties(current_device()); }
inline int warp_size() { return getCurrentDeviceProperties()->warpSize; }
inline void check(cudaError_t e, const char* file, int line) {
    if (e != cudaSuccess) abi::fail(str("CUDA error: ", cudaGetErrorString(e), " (", file, ":", line, ")").c_str());
}
class CUDAGuard {
   public:
    explicit CUDAGuard(int device) { set(device); }
    explicit CUDAGuard(Device device) { set(device.index()); }
    CUDAGuard(const CUDAGuard&) = delete;
    CUDAGuard& operator=(const CUDAGuard&) = delete;
    ~CUDAGuard() {
        if (prev_ >= 0 && prev_ != now_) cudaSetDevice(prev_);
    }

   private:
    void set(int device) {
        check(cudaGetDevice(&prev_), __FILE__, __LINE__);
        now_ = device < 0 ? prev_ : device;
        if (now_ != prev_) check(cudaSetDevice(now_), __FILE__, __LINE__);
    }
    int prev_ = -1, now_ = -1;
};
class OptionalCUDAGuard {
   public:
    OptionalCUDAGuard() = default;
    explicit OptionalCUDAGuard(std::optional<Device> d) {
        if (d && d->is_cuda()) guard_.emplace(d->index());
    }
    explicit OptionalCUDAGuard(Device d) : OptionalCUDAGuard(std::optional<Device>(d)) {}
    explicit OptionalCUDAGuard(int d) { guard_.emplace(d); }

   private:
    std::optional<CUDAGuard> guard_;
};
}  // namespace cuda
#endif

// ---- OPFORGE_EXPORT: the registration of a function, type-erased for the binding unit ------------------------
namespace reg {
template <class T> struct Arg;
template <> struct Arg<Tensor> {
    static constexpr int kind = abi::KIND_TENSOR;
    static Tensor get(const abi::ArgC& a) { return Tensor::borrow(a.tensor); }
};
template <> struct Arg<std::optional<Tensor>> {
    static constexpr int kind = abi::KIND_OPT_TENSOR;
    static std::optional<Tensor> get(const abi::ArgC& a) {
        return a.tensor ? std::optional<Tensor>(Tensor::borrow(a.tensor)) : std::nullopt;
    }
};
template <> struct Arg<std::vector<Tensor>> {
    static constexpr int kind = abi::KIND_TENSOR_LIST;
    static std::vector<Tensor> get(const abi::ArgC& a) {
        std::vector<Tensor> out;
        for (size_t i = 0; i < a.n; ++i) out.push_back(Tensor::borrow(a.tensors[i]));
        return out;
    }
};
template <> struct Arg<IntArrayRef> {
    static constexpr int kind = abi::KIND_INT_LIST;
    static IntArrayRef get(const abi::ArgC& a) { return IntArrayRef(a.ints, a.n); }
};
template <> struct Arg<std::vector<int64_t>> {
    static constexpr int kind = abi::KIND_INT_LIST;
    static std::vector<int64_t> get(const abi::ArgC& a) { return std::vector<int64_t>(a.ints, a.ints + a.n); }
};
template <> struct Arg<bool> {
    static constexpr int kind = abi::KIND_BOOL;
    static bool get(const abi::ArgC& a) { return a.i != 0; }
};
template <class T> struct IntArg {
    static constexpr int kind = abi::KIND_INT;
    static T get(const abi::ArgC& a) { return static_cast<T>(a.i); }
};
template <class T> struct FloatArg {
    static constexpr int kind = abi::KIND_DOUBLE;
    static T get(const abi::ArgC& a) { return static_cast<T>(a.d); }
};
template <> struct Arg<int64_t> : IntArg<int64_t> {};
template <> struct Arg<int32_t> : IntArg<int32_t> {};
template <> struct Arg<double> : FloatArg<double> {};
template <> struct Arg<float> : FloatArg<float> {};

template <class R> struct Ret;
template <> struct Ret<Tensor> {
    static constexpr int kind = abi::KIND_TENSOR;
    static void put(Tensor v, abi::RetC* r) { r->tensors.push_back(v.lite_release()); }
};
template <> struct Ret<std::vector<Tensor>> {
    static constexpr int kind = abi::KIND_TENSOR_LIST;
    static void put(std::vector<Tensor> v, abi::RetC* r) {
        for (auto& t : v) r->tensors.push_back(t.lite_release());
    }
};
template <class... T> struct Ret<std::tuple<T...>> {
    static_assert((std::is_same_v<T, Tensor> && ...), "OPFORGE_EXPORT: a returned tuple must hold tensors only");
    static constexpr int kind = abi::KIND_TUPLE;
    static void put(std::tuple<T...> v, abi::RetC* r) {
        std::apply([r](auto&... t) { (r->tensors.push_back(t.lite_release()), ...); }, v);
    }
};
template <class T> struct IntRet {
    static constexpr int kind = abi::KIND_INT;
    static void put(T v, abi::RetC* r) { r->i = v; }
};
template <class T> struct FloatRet {
    static constexpr int kind = abi::KIND_DOUBLE;
    static void put(T v, abi::RetC* r) { r->d = v; }
};
template <> struct Ret<int64_t> : IntRet<int64_t> {};
template <> struct Ret<int32_t> : IntRet<int32_t> {};
template <> struct Ret<double> : FloatRet<double> {};
template <> struct Ret<float> : FloatRet<float> {};
template <> struct Ret<bool> {
    static constexpr int kind = abi::KIND_BOOL;
    static void put(bool v, abi::RetC* r) { r->i = v; }
};
template <> struct Ret<void> {
    static constexpr int kind = abi::KIND_VOID;
};

template <class R, class... A, size_t... I>
void invoke(R (*f)(A...), const abi::ArgC* args, abi::RetC* r, std::index_sequence<I...>) {
    // the arguments live in a tuple, so a function may take them by value, by const reference or by reference
    auto values = std::make_tuple(Arg<std::decay_t<A>>::get(args[I])...);
    (void)values;
    if constexpr (std::is_void_v<R>) {
        f(std::get<I>(values)...);
    } else {
        Ret<std::decay_t<R>>::put(f(std::get<I>(values)...), r);
    }
}
template <class R, class... A>
void thunk(void (*fn)(), const abi::ArgC* args, abi::RetC* r) {
    invoke(reinterpret_cast<R (*)(A...)>(fn), args, r, std::index_sequence_for<A...>{});
}
struct Export {
    template <class R, class... A>
    Export(const char* name, const char* doc, R (*f)(A...)) {
        static const int kinds[sizeof...(A) + 1] = {Arg<std::decay_t<A>>::kind..., 0};
        entry_ = {name, doc, reinterpret_cast<void (*)()>(f), &thunk<R, A...>, sizeof...(A), kinds,
                  Ret<std::decay_t<R>>::kind};
        abi::add_export(&entry_);
    }
    abi::ExportEntry entry_;
};
}  // namespace reg
}  // namespace opforge_lite

#define OPFORGE_CONCAT_(a, b) a##b
#define OPFORGE_CONCAT(a, b) OPFORGE_CONCAT_(a, b)
#define OPFORGE_EXPORT(fn, doc) \
    static ::opforge_lite::reg::Export OPFORGE_CONCAT(opforge_export_, __LINE__)(#fn, doc, &fn)

// ---- the torch names --------------------------------------------------------------------------------------------
#define OPFORGE_LITE_NAMES                                                                                       \
    using ::opforge_lite::Tensor;                                                                                \
    using ::opforge_lite::ScalarType;                                                                            \
    using ::opforge_lite::Dtype;                                                                                 \
    using ::opforge_lite::Half;                                                                                  \
    using ::opforge_lite::BFloat16;                                                                              \
    using ::opforge_lite::Device;                                                                                \
    using ::opforge_lite::DeviceType;                                                                            \
    using ::opforge_lite::IntArrayRef;                                                                           \
    using ::opforge_lite::TensorOptions;                                                                         \
    using ::opforge_lite::toString;                                                                              \
    using ::opforge_lite::elementSize;                                                                           \
    using ::opforge_lite::empty;                                                                                 \
    using ::opforge_lite::zeros;                                                                                 \
    using ::opforge_lite::empty_strided;                                                                         \
    using ::opforge_lite::empty_like;                                                                            \
    using ::opforge_lite::zeros_like;                                                                            \
    using ::opforge_lite::dtype;                                                                                 \
    using ::opforge_lite::device;                                                                                \
    using ::opforge_lite::device_of;                                                                             \
    using ::opforge_lite::kByte; using ::opforge_lite::kUInt8; using ::opforge_lite::kChar;                      \
    using ::opforge_lite::kInt8; using ::opforge_lite::kShort; using ::opforge_lite::kInt16;                     \
    using ::opforge_lite::kInt; using ::opforge_lite::kInt32; using ::opforge_lite::kLong;                       \
    using ::opforge_lite::kInt64; using ::opforge_lite::kHalf; using ::opforge_lite::kFloat16;                   \
    using ::opforge_lite::kFloat; using ::opforge_lite::kFloat32; using ::opforge_lite::kDouble;                 \
    using ::opforge_lite::kFloat64; using ::opforge_lite::kBool; using ::opforge_lite::kBFloat16;                \
    using ::opforge_lite::kCPU; using ::opforge_lite::kCUDA;                                                     \
    using std::optional;                                                                                         \
    using std::nullopt;
namespace at { OPFORGE_LITE_NAMES }
namespace c10 { OPFORGE_LITE_NAMES }
namespace torch { OPFORGE_LITE_NAMES }
#undef OPFORGE_LITE_NAMES
#ifdef OPFORGE_LITE_CUDA
namespace at { namespace cuda { using namespace ::opforge_lite::cuda; } }
namespace c10 { namespace cuda { using namespace ::opforge_lite::cuda; } }
#endif

// ---- the torch macros -------------------------------------------------------------------------------------------
#define TORCH_CHECK(cond, ...)                                                                            \
    do {                                                                                                  \
        if (!(cond)) ::opforge_lite::check_fail(__FILE__, __LINE__, #cond, ::opforge_lite::str(__VA_ARGS__)); \
    } while (0)
#define TORCH_INTERNAL_ASSERT(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_CHECK_VALUE(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define TORCH_CHECK_TYPE(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define AT_ASSERT(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define AT_ERROR(...) ::opforge_lite::check_fail(__FILE__, __LINE__, "AT_ERROR", ::opforge_lite::str(__VA_ARGS__))
#ifdef OPFORGE_LITE_CUDA
#define C10_CUDA_CHECK(expr) ::opforge_lite::cuda::check((expr), __FILE__, __LINE__)
#define AT_CUDA_CHECK(expr) C10_CUDA_CHECK(expr)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())
#endif

#define OPFORGE_LITE_CASE(st, type, ...) \
    case st: {                           \
        using scalar_t = type;           \
        return __VA_ARGS__();            \
    }
#define OPFORGE_LITE_DISPATCH(TYPE, NAME, CASES)                                                                 \
    [&] {                                                                                                        \
        const ::opforge_lite::ScalarType opforge_st_ = (TYPE);                                                   \
        switch (opforge_st_) {                                                                                   \
            CASES                                                                                                \
            default:                                                                                             \
                ::opforge_lite::check_fail(__FILE__, __LINE__, NAME,                                             \
                                           ::opforge_lite::str(NAME, " not implemented for '",                   \
                                                               ::opforge_lite::toString(opforge_st_), "'"));     \
        }                                                                                                        \
    }()
#define AT_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                                                               \
    OPFORGE_LITE_DISPATCH(TYPE, NAME,                                                                            \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Double, double, __VA_ARGS__)             \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Float, float, __VA_ARGS__))
#define AT_DISPATCH_FLOATING_TYPES_AND_HALF(TYPE, NAME, ...)                                                      \
    OPFORGE_LITE_DISPATCH(TYPE, NAME,                                                                            \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Double, double, __VA_ARGS__)             \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Float, float, __VA_ARGS__)               \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Half, ::opforge_lite::Half, __VA_ARGS__))
#define AT_DISPATCH_FLOATING_TYPES_AND2(T1, T2, TYPE, NAME, ...)                                                   \
    OPFORGE_LITE_DISPATCH(TYPE, NAME,                                                                            \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Double, double, __VA_ARGS__)             \
                          OPFORGE_LITE_CASE(::opforge_lite::ScalarType::Float, float, __VA_ARGS__)               \
                          OPFORGE_LITE_CASE(T1, typename ::opforge_lite::CppTypeOf<T1>::type, __VA_ARGS__)                \
                          OPFORGE_LITE_CASE(T2, typename ::opforge_lite::CppTypeOf<T2>::type, __VA_ARGS__))
