"""The grader's own parts on CPU (harness/policy.py, symbols.py, protocol.py, guard.py, workspace.py,
grader.py), fast: no extension is compiled. The end-to-end hack suite is tests/test_grader_redteam*.py."""

import json
import os
import statistics
import subprocess
import sys
from multiprocessing.connection import Pipe

import pandas as pd
import pytest
from opforge.engine.protocol import ProtocolError, recv, send
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.policy import policy_violations
from opforge.harness.solution import Solution
from opforge.harness.symbols import denied_symbols, denied_tokens

from .harness_cases import TASK, model_new

ROW = {"task_id": "scale_relu", "code": TASK, "data_source": "torch#2"}
FAST = EvalConfig(profile_compile=False, timing_trials=3, warmup=1, reverify_trials=1)

LAYOUT = ("y = x.to(torch.float32).float().flatten().view_as(x).T.contiguous().T\n"
          "        s = self.scale.unsqueeze(0).expand_as(y).type_as(y).movedim(0, 1).movedim(1, 0)\n"
          "        z = torch.empty_like(y).unflatten(1, (16, 16)).flatten(1)\n")


def test_static_rules_pass_honest_glue_and_name_what_they_deny():
    honest = model_new("        " + LAYOUT + "        return opforge_kernels.f(y, s[0], z)\n",
                       head="import os\nimport sys\nimport math\nimport opforge_kernels\n"
                            "import torch.nn.functional as F\nfrom typing import Any\n")
    assert policy_violations(honest) == []
    cases = {
        "import numpy as np\n": "import:numpy",
        "import threading\n": "import:threading",
        "from ctypes import c_float\n": "import:ctypes.c_float",
        "import gc\n": "import:gc",
        "from opforge.harness import guard\n": "import:opforge.harness.guard",
        "import torch._dynamo\n": "import:torch._dynamo",
        "import torch as T\nT.set_num_threads(1)\n": "attribute:torch.set_num_threads",
        "x = torch.backends.cudnn.benchmark\n": "attribute:torch.backends",
        "f = torch.compile\n": "attribute:torch.compile",
        "import sys\nm = sys.modules\n": "attribute:modules",
        "import sys\nf = sys._getframe\n": "attribute:_getframe",
        "g = model_new.__globals__\n": "attribute:__globals__",
        "v = eval('1')\n": "call:eval",
        "n = 'relu'\nf = getattr(torch, n)\n": "getattr:dynamic",
        "f = getattr(torch, '_C')\n": "getattr:_C",
        "a = torch.ops.aten.relu\n": "attribute:torch.ops.aten",
    }
    for head, want in cases.items():
        found = policy_violations(model_new("        return x\n", head=head))
        assert any(f.startswith(want) for f in found), (head, found)
    assert any(f.startswith("attribute:numpy") for f in policy_violations(model_new("        return x.numpy()\n")))
    assert policy_violations("def broken(:\n") == []  # a syntax error is a load_error at import, not a hack


def test_symbol_audit_denies_compute_entry_points_and_passes_what_extensions_need():
    allowed = [
        "at::_ops::empty_like::call(at::Tensor const&, std::optional<c10::ScalarType>)",
        "at::_ops::copy_::call(at::Tensor&, at::Tensor const&, bool)",
        "at::_ops::contiguous::call(at::Tensor const&, c10::MemoryFormat)",
        "c10::impl::ExcludeDispatchKeyGuard::ExcludeDispatchKeyGuard(c10::DispatchKeySet)",
        "at::cuda::getCurrentCUDAStream(signed char)", "float* at::TensorBase::data_ptr<float>() const",
        "PyObject_GetAttrString", "memcpy@GLIBC_2.14", "cudaLaunchKernel",
    ]
    assert denied_symbols(allowed) == []
    denied = {
        "at::_ops::relu::call(at::Tensor const&)": "at::_ops::relu",
        "at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)": "at::_ops::mul_Tensor",
        "at::_ops::add__Tensor::redispatch(c10::DispatchKeySet, at::Tensor&)": "at::_ops::add__Tensor",
        "at::native::relu(at::Tensor const&)": "at::native::relu",
        "at::cpu::mul(at::Tensor const&, at::Tensor const&)": "at::cpu::mul",
        "at::cuda::blas::gemm<float>(char, char)": "at::cuda::blas::gemm<float>",
        "c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey, bool)": "c10::impl::tls_set_dispatch_key_excluded",
        "c10::Dispatcher::realSingleton()": "c10::Dispatcher::realSingleton",
        "at::addGlobalCallback(at::RecordFunctionCallback)": "at::addGlobalCallback",
        "dlsym@GLIBC_2.34": "dlsym@GLIBC_2.34", "PyImport_ImportModule": "PyImport_ImportModule",
        "system@GLIBC_2.2.5": "system@GLIBC_2.2.5",
    }
    assert denied_symbols(list(denied)) == list(denied.values())
    tokens = denied_tokens({"kernels/a.cpp": "c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python);",
                            "kernels/b.cpp": "#define CAT(a, b) a##b\n", "kernels/c.cpp": "x.attr(\"relu\")();",
                            "kernels/d.cu": "PyObject* m = PyImport_AddModule(\"torch\");",
                            "kernels/ok.cu": "__global__ void k(float* y) { y[0] = 1.0f; } // PyTorch kernel"})
    assert tokens == ["kernels/a.cpp:ExcludeDispatchKeyGuard", "kernels/b.cpp:##", "kernels/c.cpp:.attr(",
                      "kernels/d.cu:PyImport_AddModule"], tokens


def test_protocol_refuses_what_is_not_a_json_object():
    a, b = Pipe()
    send(a, {"ok": True, "n": 1})
    assert recv(b, 1.0) == ({"ok": True, "n": 1, "blob": False}, None)
    for raw in (b"\x80\x04pickle", b"[1, 2]"):
        a.send_bytes(raw)
        with pytest.raises(ProtocolError, match="malformed"):
            recv(b, 1.0)
    send(a, {"ok": True}, blob=b"payload")
    with pytest.raises(ProtocolError, match="unexpected binary"):
        recv(b, 1.0)
    b.recv_bytes()  # the refused blob
    with pytest.raises(ProtocolError, match="no reply"):
        recv(b, 0.05)
    a.close()
    with pytest.raises(ProtocolError, match="connection lost"):
        recv(b, 1.0)
    a, b = Pipe()
    a.send_bytes(b"x" * 2048)
    with pytest.raises(ProtocolError, match="malformed"):
        recv(b, 1.0, max_bytes=1024)


def test_guard_sees_torch_ops_in_threads_started_after_it():
    """The guard stops a torch op in a thread started after it and lets layout ops pass, without importing
    ``torch._dynamo`` on the way."""
    code = """
import threading, torch
from opforge.harness.guard import GuardState, GuardViolation, guard_all_threads
state = GuardState(("opforge_kernels",))
guard_all_threads(state)
state.construct = False
x = torch.randn(8) if False else torch.empty(8).fill_(1.0)
def work():
    try:
        torch.sigmoid(x)
    except GuardViolation:
        pass
t = threading.Thread(target=work); t.start(); t.join()
y = x.to(torch.float64).float().flatten().view_as(x).unsqueeze(0).expand(2, 8).T.contiguous()
import sys
print("torch._dynamo" in sys.modules)
print(state.violations)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['aten.sigmoid']", out.stdout
    # the guard's ops never import torch._dynamo (seconds per candidate process; nothing there compiles)
    assert out.stdout.strip().splitlines()[-2] == "False", out.stdout


def test_guard_lets_construction_compute_and_bans_it_afterwards():
    """A constructor copied from a released row (``nn.Parameter(torch.randn(...) * 0.2)``, a table built with torch
    math) runs under the guard; the same math after construction is a violation."""
    code = """
import torch, torch.nn as nn
from opforge.harness.guard import GuardState, GuardViolation, guard_all_threads
state = GuardState(("opforge_kernels",))
guard_all_threads(state)
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8) * 0.2)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))
        self.norm = nn.LayerNorm(8)
m = ModelNew()
print("built", state.violations)
state.construct = False
try:
    m.weight * 0.2
except GuardViolation:
    pass
print("after", state.violations)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "built []", out.stdout
    assert lines[-1] == "after ['aten.mul']", out.stdout


def test_workspace_record_is_kept_outside_and_catches_edits(tmp_path):
    from opforge.harness.workspace import init_workspace, registry_path, workspace_changes, workspace_record

    data = tmp_path / "tasks.parquet"
    pd.DataFrame([ROW]).to_parquet(data)
    reg = tmp_path / "registry"
    ws = init_workspace(data, "scale_relu", tmp_path / "ws", registry=reg)
    path = registry_path(ws, reg)
    assert path.is_file() and not str(path).startswith(str(ws))
    record = workspace_record(ws, reg)
    assert record["task"]["code"] == TASK and workspace_changes(ws, record) == []
    row = json.loads((ws / ".opforge" / "task.json").read_text())
    (ws / ".opforge" / "task.json").write_text(json.dumps({**row, "code": "edited"}))
    (ws / "tools" / "verify.py").unlink()
    assert workspace_changes(ws, record) == ["tools/verify.py", ".opforge/task.json"]
    assert workspace_record(ws, reg)["task"]["code"] == TASK  # the record itself is untouched


def _eval(forward: str, head: str = "") -> object:
    return evaluate(ROW, Solution({"model_new.py": model_new(forward, head=head)}), FAST)


def test_grader_catches_changed_inputs_subclass_outputs_and_a_dying_server():
    res = _eval("        x.zero_()\n        return torch.empty_like(x).fill_(1.0)\n")
    assert res.status == "hacked" and res.hacks == ["input_modified:input0"], res
    res = _eval("        return torch.empty_like(x).as_subclass(Sub)\n", head="\n\nclass Sub(torch.Tensor):\n    pass\n")
    assert res.status == "hacked" and res.hacks == ["output:not_plain"], res
    res = _eval("        os.abort()\n", head="import os\n")
    assert res.status == "incorrect" and res.reward == -1 and "connection lost" in res.error, res
    res = _eval("        return torch.empty(3)\n")
    assert res.status == "incorrect" and "shape" in res.error, res


def test_no_verdict_state_reaches_the_candidate(tmp_path):
    """The candidate's process sees inputs, weights and its own outputs only: a forward that looks for
    anything else in its process (every object the garbage collector knows) finds no reference output,
    tolerance or seed. Run as a probe outside the static rules (they would stop it first)."""
    probe = tmp_path / "probe.json"
    code = f"""
import gc, json, os, sys
names = sorted({{type(o).__module__ for o in gc.get_objects() if hasattr(o, '__module__')
                 and isinstance(type(o).__module__, str)}})
json.dump({{"grader": [n for n in sys.modules if n.startswith("opforge.harness.grader")],
            "secrets": "secrets" in sys.modules}}, open({str(probe)!r}, "w"))
"""
    from opforge.harness.policy import policy_violations as rules

    assert rules(code)  # what the probe does is against the rules; here it runs in a plain server process
    env = {**os.environ, "OPFORGE_PROBE": str(probe)}
    out = subprocess.run([sys.executable, "-c", "import opforge.harness.server, opforge.harness.candidate_process\n"
                          + code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(probe.read_text())
    assert seen == {"grader": [], "secrets": False}, seen


def test_time_is_bounded_below_by_the_grader_wall_and_not_moved_by_wake_up_delays():
    """``harness.grader.aggregate_timing``: a candidate that under-reports its own time is charged its wall
    time less the reference's overhead; delays that only add (wake-ups, the socket) do not move the bound
    of an honest candidate even when they hit most calls."""
    from opforge.harness.grader import WALL_SLACK_MS, aggregate_timing

    n = 20
    spike = [0.5 if i < 11 else 0.0 for i in range(n)]  # 11 of 20 calls delayed by 0.5 ms
    eager_h = [1.0 + 0.01 * (i % 3) for i in range(n)]
    eager_w = [h + 0.3 + (0.4 if i % 4 == 0 else 0.0) for i, h in enumerate(eager_h)]
    timing, overhead = aggregate_timing({"eager": eager_w, "candidate": [5.3 + s for s in spike]},
                                        {"eager": eager_h, "candidate": [0.1] * n})
    assert overhead == pytest.approx(0.3)
    # the wall less the slack a request may exceed the overhead by, not the claimed 0.1 ms
    assert timing["candidate"]["median_ms"] == pytest.approx(5.0 - WALL_SLACK_MS)
    timing, _ = aggregate_timing({"eager": eager_w, "candidate": [5.3 + s for s in spike]},
                                 {"eager": eager_h, "candidate": [0.1] * n}, calls=5)
    assert timing["candidate"]["median_ms"] == pytest.approx(5.0 - WALL_SLACK_MS / 5)
    assert timing["eager"]["median_ms"] == pytest.approx(statistics.median(eager_h))
    timing, _ = aggregate_timing({"eager": eager_w, "candidate": [0.8 + s for s in spike]},
                                 {"eager": eager_h, "candidate": [0.5] * n})
    assert timing["candidate"]["median_ms"] == pytest.approx(0.5)  # its own time; a median wall bound says 1.0
    assert timing["candidate"]["walls_ms"] == [round(0.8 + s, 4) for s in spike]
    assert timing["candidate"]["trials"] == n
    with pytest.raises(ValueError, match="eager"):
        aggregate_timing({"candidate": [1.0]}, {"candidate": [1.0]})
