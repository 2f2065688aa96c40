"""The extension build (harness/build.py, harness/child.py, harness/toolchain.py) on CPU: content-keyed
modules and objects, the precompiled header's rule, compiler errors and extra include folders."""

import json
import subprocess
import sys

import pytest
from opforge.harness.build import build_extension
from opforge.harness.child import pch_applies
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
