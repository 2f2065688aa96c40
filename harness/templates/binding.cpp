// opforge harness: fixed module definition (do not edit); see registry.h.
#include "registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    for (auto& add : opforge::exporters()) add(m);
}
