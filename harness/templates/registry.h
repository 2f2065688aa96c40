// opforge harness: fixed registration helper (do not edit). A kernel source registers a function with
// OPFORGE_EXPORT(function, "doc"); kernels/binding.cpp puts every registered function into the module.
#pragma once
#include <torch/extension.h>
#include <functional>
#include <vector>

namespace opforge {
using Exporter = std::function<void(pybind11::module_&)>;
inline std::vector<Exporter>& exporters() {
    static std::vector<Exporter> all;
    return all;
}
struct Export {
    explicit Export(Exporter fn) { exporters().push_back(std::move(fn)); }
};
}  // namespace opforge

#define OPFORGE_CONCAT_(a, b) a##b
#define OPFORGE_CONCAT(a, b) OPFORGE_CONCAT_(a, b)
#define OPFORGE_EXPORT(fn, doc) \
    static opforge::Export OPFORGE_CONCAT(opforge_export_, __LINE__)([](pybind11::module_& m) { m.def(#fn, &fn, doc); })
