// opforge harness: the fixed binding unit of the light-header build (do not edit). It holds the real torch:
// it implements opforge_lite_abi.h (each tensor call of a source built against lite/opforge_lite.h is the
// torch call of the same name here) and makes the Python module, with every function registered by
// OPFORGE_EXPORT in those sources and in sources built against the real registry.h.
#include <torch/extension.h>
#ifdef OPFORGE_LITE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <stdexcept>
#include <string>
#include <vector>

#include "lite/opforge_lite_abi.h"
#include "registry.h"

namespace py = pybind11;

static_assert(static_cast<int>(c10::ScalarType::Byte) == 0 && static_cast<int>(c10::ScalarType::Half) == 5 &&
                  static_cast<int>(c10::ScalarType::Float) == 6 && static_cast<int>(c10::ScalarType::Bool) == 11 &&
                  static_cast<int>(c10::ScalarType::BFloat16) == 15,
              "opforge_lite.h numbers scalar types as c10::ScalarType does");
static_assert(static_cast<int>(c10::DeviceType::CPU) == 0 && static_cast<int>(c10::DeviceType::CUDA) == 1,
              "opforge_lite.h numbers device types as c10::DeviceType does");

namespace {
c10::TensorImpl* impl(void* t) { return static_cast<c10::TensorImpl*>(t); }
at::Tensor borrow(void* t) {
    return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl(t)));
}
void* release(at::Tensor t) { return t.defined() ? t.unsafeReleaseTensorImpl() : nullptr; }
at::IntArrayRef ints(const int64_t* p, size_t n) { return at::IntArrayRef(p, n); }
at::TensorOptions options(int st, int dev_type, int dev_index) {
    at::TensorOptions o;
    if (st >= 0) o = o.dtype(static_cast<c10::ScalarType>(st));
    if (dev_type >= 0) o = o.device(c10::Device(static_cast<c10::DeviceType>(dev_type), static_cast<int8_t>(dev_index)));
    return o;
}
std::vector<const opforge_lite_abi::ExportEntry*>& entries() {
    static std::vector<const opforge_lite_abi::ExportEntry*> all;
    return all;
}
}  // namespace

namespace opforge_lite_abi {
void incref(void* t) { c10::raw::intrusive_ptr::incref(impl(t)); }
void decref(void* t) { c10::raw::intrusive_ptr::decref(impl(t)); }
void* data_ptr(void* t) { return borrow(t).data_ptr(); }
int64_t dim(void* t) { return impl(t)->dim(); }
const int64_t* sizes(void* t) { return impl(t)->sizes().data(); }
const int64_t* strides(void* t) { return impl(t)->strides().data(); }
int64_t numel(void* t) { return impl(t)->numel(); }
int64_t storage_offset(void* t) { return impl(t)->storage_offset(); }
int scalar_type(void* t) { return static_cast<int>(borrow(t).scalar_type()); }
int device_type(void* t) { return static_cast<int>(impl(t)->device().type()); }
int device_index(void* t) { return impl(t)->device().index(); }
bool is_contiguous(void* t) { return borrow(t).is_contiguous(); }
const char* scalar_type_name(int st) { return c10::toString(static_cast<c10::ScalarType>(st)); }
void* empty(const int64_t* shape, size_t n, int st, int dt, int di) {
    return release(at::empty(ints(shape, n), options(st, dt, di)));
}
void* empty_strided(const int64_t* shape, const int64_t* strides, size_t n, int st, int dt, int di) {
    return release(at::empty_strided(ints(shape, n), ints(strides, n), options(st, dt, di)));
}
void* zeros(const int64_t* shape, size_t n, int st, int dt, int di) {
    return release(at::zeros(ints(shape, n), options(st, dt, di)));
}
void* empty_like(void* t, int st, int dt, int di) { return release(at::empty_like(borrow(t), options(st, dt, di))); }
void* zeros_like(void* t, int st, int dt, int di) { return release(at::zeros_like(borrow(t), options(st, dt, di))); }
void* contiguous(void* t) { return release(borrow(t).contiguous()); }
void* clone(void* t) { return release(borrow(t).clone()); }
void* to(void* t, int st, int dt, int di) {
    at::Tensor x = borrow(t);
    return release(x.to(options(st < 0 ? static_cast<int>(x.scalar_type()) : st, dt < 0 ? device_type(t) : dt,
                                dt < 0 ? device_index(t) : di)));
}
void* view(void* t, const int64_t* shape, size_t n) { return release(borrow(t).view(ints(shape, n))); }
void* reshape(void* t, const int64_t* shape, size_t n) { return release(borrow(t).reshape(ints(shape, n))); }
void* transpose(void* t, int64_t a, int64_t b) { return release(borrow(t).transpose(a, b)); }
void* permute(void* t, const int64_t* dims, size_t n) { return release(borrow(t).permute(ints(dims, n))); }
void* narrow(void* t, int64_t d, int64_t start, int64_t len) { return release(borrow(t).narrow(d, start, len)); }
void* select(void* t, int64_t d, int64_t i) { return release(borrow(t).select(d, i)); }
void* unsqueeze(void* t, int64_t d) { return release(borrow(t).unsqueeze(d)); }
void* squeeze(void* t, int64_t d) { return release(borrow(t).squeeze(d)); }
void* expand(void* t, const int64_t* shape, size_t n) { return release(borrow(t).expand(ints(shape, n))); }
void* flatten(void* t, int64_t start, int64_t end) { return release(borrow(t).flatten(start, end)); }
void zero_(void* t) { borrow(t).zero_(); }
void fill_(void* t, double v) { borrow(t).fill_(v); }
void copy_(void* t, void* src) { borrow(t).copy_(borrow(src)); }
#ifdef OPFORGE_LITE_CUDA
void* current_stream(int device) {
    return at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}
int current_device() { return at::cuda::current_device(); }
const void* device_properties(int device) { return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device)); }
#else
void* current_stream(int) { fail("getCurrentCUDAStream: this extension was built without CUDA"); }
int current_device() { fail("current_device: this extension was built without CUDA"); }
const void* device_properties(int) { fail("getCurrentDeviceProperties: this extension was built without CUDA"); }
#endif
void fail(const char* message) { throw std::runtime_error(message); }
void add_export(const ExportEntry* entry) { entries().push_back(entry); }
}  // namespace opforge_lite_abi

namespace {
using namespace opforge_lite_abi;

const char* kind_name(int k) {
    switch (k) {
        case KIND_TENSOR: return "Tensor";
        case KIND_OPT_TENSOR: return "Optional[Tensor]";
        case KIND_TENSOR_LIST: return "List[Tensor]";
        case KIND_INT: return "int";
        case KIND_DOUBLE: return "float";
        case KIND_BOOL: return "bool";
        case KIND_INT_LIST: return "List[int]";
        default: return "?";
    }
}

std::string signature(const ExportEntry& e) {
    std::string s = std::string(e.name) + "(";
    for (size_t i = 0; i < e.nargs; ++i) s += std::string(i ? ", " : "") + kind_name(e.kinds[i]);
    return s + ")";
}

py::object call(const ExportEntry& e, const py::args& args) {
    if (args.size() != e.nargs)
        throw py::type_error(signature(e) + ": takes " + std::to_string(e.nargs) + " positional arguments but " +
                             std::to_string(args.size()) + " were given");
    std::vector<ArgC> c(e.nargs, ArgC{nullptr, nullptr, nullptr, 0, 0, 0.0});
    std::vector<at::Tensor> keep;                   // owns every tensor argument for the call
    std::vector<std::vector<void*>> lists(e.nargs);
    std::vector<std::vector<int64_t>> int_lists(e.nargs);
    for (size_t i = 0; i < e.nargs; ++i) {
        py::handle a = args[i];
        try {
            switch (e.kinds[i]) {
                case KIND_OPT_TENSOR:
                    if (a.is_none()) break;
                    [[fallthrough]];
                case KIND_TENSOR:
                    keep.push_back(a.cast<at::Tensor>());
                    c[i].tensor = keep.back().defined() ? keep.back().unsafeGetTensorImpl() : nullptr;
                    break;
                case KIND_TENSOR_LIST:
                    for (auto& t : a.cast<std::vector<at::Tensor>>()) {
                        keep.push_back(t);
                        lists[i].push_back(t.unsafeGetTensorImpl());
                    }
                    break;
                case KIND_INT_LIST:
                    int_lists[i] = a.cast<std::vector<int64_t>>();
                    c[i].ints = int_lists[i].data();
                    c[i].n = int_lists[i].size();
                    break;
                case KIND_INT: c[i].i = a.cast<int64_t>(); break;
                case KIND_BOOL: c[i].i = a.cast<bool>() ? 1 : 0; break;
                case KIND_DOUBLE: c[i].d = a.cast<double>(); break;
                default: throw py::type_error("unsupported argument kind");
            }
        } catch (const py::cast_error&) {
            throw py::type_error(signature(e) + ": argument " + std::to_string(i) + " must be " +
                                 kind_name(e.kinds[i]) + ", not " + Py_TYPE(a.ptr())->tp_name);
        }
    }
    for (size_t i = 0; i < e.nargs; ++i)
        if (e.kinds[i] == KIND_TENSOR_LIST) {
            c[i].tensors = lists[i].data();
            c[i].n = lists[i].size();
        }
    RetC r;
    e.call(e.fn, c.data(), &r);
    std::vector<at::Tensor> out;
    for (void* p : r.tensors)
        out.push_back(p ? at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl(p)))
                        : at::Tensor());
    switch (e.ret_kind) {
        case KIND_VOID: return py::none();
        case KIND_TENSOR: return out.at(0).defined() ? py::cast(out[0]) : py::none();
        case KIND_TENSOR_LIST: return py::cast(out);
        case KIND_TUPLE: {
            py::tuple t(out.size());
            for (size_t i = 0; i < out.size(); ++i) t[i] = py::cast(out[i]);
            return t;
        }
        case KIND_INT: return py::int_(r.i);
        case KIND_BOOL: return py::bool_(r.i != 0);
        case KIND_DOUBLE: return py::float_(r.d);
        default: throw py::type_error("unsupported result kind");
    }
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    for (auto& add : opforge::exporters()) add(m);
    for (const ExportEntry* e : entries()) {
        const ExportEntry& entry = *e;
        m.def(entry.name, [&entry](py::args args) { return call(entry, args); }, entry.doc);
    }
}
