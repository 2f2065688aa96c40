"""The extension build (harness/build.py, harness/child.py, harness/toolchain.py) on CPU: content-keyed
modules and objects, the precompiled header's rule, the light torch headers and their fallback, compiler
errors and extra include folders."""

import json
import subprocess
import sys

import pytest
from opforge.harness.build import build_extension
from opforge.harness.child import lite_blocker, pch_applies
from opforge.harness.solution import Solution

from .harness_cases import EXPORT_KERNEL, HONEST

SOLUTION = {"model_new.py": HONEST["model_new.py"], "kernels/fused.cpp": EXPORT_KERNEL}


def _call(module_path: str) -> list[float]:
    """fused_scale_relu(x, scale) of a built module, in a process of its own: x = [-3, 0, 1], scale = 1."""
    code = ("import importlib.util, json, sys, torch; "
            f"spec = importlib.util.spec_from_file_location('opforge_kernels', {module_path!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(json.dumps(m.fused_scale_relu(torch.tensor([-3.0, 0.0, 1.0]), torch.ones(3)).tolist()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pch_rule():
    assert pch_applies('// c\n#include "registry.h"\n')
    assert pch_applies("#pragma once\n/* x\n#define A */\n#include <torch/extension.h>\n")
    assert pch_applies("#  include<vector>\n")
    assert not pch_applies("#define TORCH_ASSERT_ONLY_METHOD_OPERATORS\n#include <torch/extension.h>\n")
    assert not pch_applies("#ifdef X\n#include <torch/extension.h>\n#endif\n")
    assert not pch_applies("int f() { return 1; }\n")


@pytest.mark.slow
def test_one_character_change_is_rebuilt_and_unchanged_sources_are_cached(tmp_path):
    root = tmp_path / "ext"
    first = build_extension(Solution(SOLUTION), root)
    assert first.ok and not first.cached, first
    edited = dict(SOLUTION, **{"kernels/fused.cpp": EXPORT_KERNEL.replace("+ 1.0f", "+ 2.0f", 1)})
    assert sum(a != b for a, b in zip(edited["kernels/fused.cpp"], EXPORT_KERNEL, strict=True)) == 1
    second = build_extension(Solution(edited), root)
    assert second.ok and not second.cached and second.module_path != first.module_path, second
    assert _call(first.module_path) == [0.0, 1.0, 2.0]
    assert _call(second.module_path) == [0.0, 2.0, 3.0]  # the changed source, never the old object
    log = open(second.log).read()
    assert "1 to compile" in log and "kernels/fused.cpp" in log  # only the kernel: binding.o is the toolchain's
    again = build_extension(Solution(SOLUTION), root)
    assert again.cached and again.module_path == first.module_path
    # a fresh module folder for the first sources reuses their object: nothing is compiled, only linked
    other = build_extension(Solution(SOLUTION), root, extra_ldflags=["-Wl,-O1"])
    assert other.ok and not other.cached and other.module_path != first.module_path
    assert "0 to compile" in open(other.log).read()


@pytest.mark.slow
def test_compiler_error_and_extra_include_folder(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "opforge_offset.h").write_text("#pragma once\nconstexpr float OPFORGE_OFFSET = 5.0f;\n")
    kernel = EXPORT_KERNEL.replace('#include "registry.h"', '#include "registry.h"\n#include "opforge_offset.h"'
                                   ).replace("+ 1.0f", "+ OPFORGE_OFFSET", 1)
    sol = Solution(dict(SOLUTION, **{"kernels/fused.cpp": kernel}))
    missing = build_extension(sol, tmp_path / "ext")
    assert not missing.ok and "opforge_offset.h" in missing.error and "error" in missing.error.lower()
    res = build_extension(sol, tmp_path / "ext", extra_include_paths=[str(inc)])
    assert res.ok, res.error
    assert _call(res.module_path) == [2.0, 5.0, 6.0]


def test_light_header_rule():
    ok = {"kernels/a.cu": '#include "registry.h"\n#include <ATen/cuda/CUDAContext.h>\n#include <cuda_fp16.h>\n',
          "kernels/b.cuh": "#include <torch/extension.h>\n#include <vector>\n",
          "kernels/registry.h": "#include <torch/script.h>\n"}  # the fixed file is the harness's, not read
    assert lite_blocker(ok) is None
    assert "torch/script.h" in lite_blocker({**ok, "kernels/c.cpp": "#include <torch/script.h>\n"})
    assert "ATen/ops/add.h" in lite_blocker({**ok, "kernels/c.cpp": '#  include "ATen/ops/add.h"\n'})
    assert "PYBIND11_MODULE" in lite_blocker({"kernels/a.cpp": "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"})
    assert lite_blocker({"kernels/a.cpp": "// #include <torch/script.h>\n/* #include <ATen/ops/add.h> */\n"}) is None


def test_light_flags_drop_torch_and_python_includes():
    import sysconfig
    from pathlib import Path

    import torch
    from opforge.harness.toolchain import strip_torch_includes

    tdir = Path(torch.__file__).parent
    py = sysconfig.get_paths()["include"]
    flags = ["-DX=1", "-isystem", str(tdir / "include"), f"-I{tdir / 'include' / 'torch' / 'csrc'}", f"-isystem{py}",
             "-isystem", "/usr/local/cuda/include", "-I/opt/inc", "-fPIC", "-std=c++17"]
    assert strip_torch_includes(flags) == ["-DX=1", "-isystem", "/usr/local/cuda/include", "-I/opt/inc", "-fPIC",
                                           "-std=c++17"]


LITE_EXTRA = r"""
std::tuple<torch::Tensor, torch::Tensor> pair(const torch::Tensor& x, double a, int64_t k, bool flag,
                                              std::optional<torch::Tensor> maybe, std::vector<int64_t> shape) {
    TORCH_CHECK(x.dim() >= 1, "need a dimension, got ", x.dim());
    auto y = torch::empty(shape, x.options().dtype(torch::kFloat64));
    y.fill_(a + k + (flag ? 1 : 0) + (maybe.has_value() ? 100 : 0));
    return {y, x.contiguous().view({-1}).narrow(0, 1, 2)};
}
OPFORGE_EXPORT(pair, "several argument and result kinds");
void boom(torch::Tensor& x) {
    const auto where = at::device_of(x);
    TORCH_CHECK(!where.has_value() || x.numel() < 0, "boom ", 42);
}
OPFORGE_EXPORT(boom, "always fails");
int64_t ndim(const torch::Tensor& x) { return x.dim(); }
OPFORGE_EXPORT(ndim, "an int back");
float halve(double v) { return static_cast<float>(v / 2); }
OPFORGE_EXPORT(halve, "a float back");
"""


def _run_module(module_path: str, code: str) -> str:
    head = ("import importlib.util, json, sys, torch; "
            f"spec = importlib.util.spec_from_file_location('opforge_kernels', {module_path!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n")
    out = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_light_headers_build_behaves_as_torch_and_falls_back_to_the_full_headers(tmp_path):
    sol = Solution(dict(SOLUTION, **{"kernels/fused.cpp": EXPORT_KERNEL + LITE_EXTRA}))
    res = build_extension(sol, tmp_path / "ext")
    assert res.ok, res.error
    log = open(res.log).read()
    assert "light headers: 1 units, 1 to compile" in log and "lite_binding.o" in log and "full torch" not in log
    assert _call(res.module_path) == [0.0, 1.0, 2.0]
    out = _run_module(res.module_path, """x = torch.arange(6.0).view(2, 3)
y, v = m.pair(x, 1.5, 2, True, None, [2, 2])
z, _ = m.pair(x, 0.5, 1, False, x, [3])
errors = []
for call in (lambda: m.boom(x), lambda: m.pair(x, 1.0), lambda: m.pair(x, "a", 2, True, None, [1]),
             lambda: m.fused_scale_relu(x.double(), torch.ones(3))):
    try:
        call()
    except (RuntimeError, TypeError) as exc:
        errors.append(type(exc).__name__ + ": " + str(exc).splitlines()[0])
print(json.dumps([y.tolist(), str(y.dtype), v.tolist(), z.tolist(), errors, m.ndim(x), m.halve(3)]))""")
    y, dtype, v, z, errors, ndim, half = json.loads(out)
    assert ndim == 2 and half == 1.5
    assert y == [[4.5, 4.5], [4.5, 4.5]] and dtype == "torch.float64" and v == [1.0, 2.0] and z == [101.5] * 3
    assert errors[0].startswith("RuntimeError: boom 42")
    assert errors[1].startswith("TypeError:") and "6 positional arguments but 2" in errors[1]
    assert errors[2].startswith("TypeError:") and "argument 1 must be float" in errors[2]
    assert errors[3] == "RuntimeError: expected scalar type Float but found Double"
    # a source that needs more of torch than the light headers hold is built with the full headers
    accessor = EXPORT_KERNEL.replace("const int64_t c = scale.numel()", "const int64_t c = scale.accessor<float, 1>().size(0)")
    assert accessor != EXPORT_KERNEL
    full = build_extension(Solution(dict(SOLUTION, **{"kernels/fused.cpp": accessor})), tmp_path / "ext")
    assert full.ok, full.error
    log = open(full.log).read()
    assert "accessor" in log and "full torch headers" in log
    assert _call(full.module_path) == [0.0, 1.0, 2.0]


def test_toolchain_key_follows_the_visible_gpus_compute_capabilities(tmp_path, monkeypatch):
    from opforge.harness.toolchain import toolchain_key, visible_compute_caps

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, GPU-aaa1, 9.0\\n1, GPU-bbb2, 9.0\\n2, GPU-ccc3, 8.0\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_compute_caps() == ["8.0", "9.0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    key0 = toolchain_key("cuda")
    assert visible_compute_caps() == ["9.0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb")
    assert visible_compute_caps() == ["9.0"] and toolchain_key("cuda") == key0  # a worker pinned to an equal GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert visible_compute_caps() == ["8.0"] and toolchain_key("cuda") != key0
