"""The candidate's side of the grader: a one-shot server process that only runs ``ModelNew`` on the inputs
it is given (``harness.server``, role ``candidate``).

Setup, in this order (``setup``): pin the runtime settings (``harness.guard.pin_config``); snapshot the
timing, synchronisation, event and statistics functions (``harness.timing_tamper.TimingSnapshot``); enter the
dispatcher guard in this thread and every later one (``harness.guard.guard_all_threads``, construction
rules); load the built extension; import ``model_new.py``; build ``ModelNew(*init_inputs)``; then forward
rules, and the reference's weights are loaded (``load_state_dict``, non-strict: the names must match).

This process holds no reference output, tolerance, seed, timing aggregate or verdict: each reply reports
what was seen here (guard violations, changed settings, replaced timing functions, aliasing), and the grader
decides.

Setup message fields: ``model_new`` (source), ``module_path`` (built ``.so`` or None), ``device``,
``threads``, ``allow_tf32``, ``namespaces``, ``seed``, ``slots`` (``harness.slots.SlotSpec`` dicts, mapped
before the guard is entered); blob: ``engine.protocol.pack_pair(payload, ipc)``, where ``payload`` is the reference
server's ``torch.save`` bytes of ``{"init_inputs": list, "state": state_dict}`` and ``ipc`` the CUDA IPC
handles of the slots (empty on CPU).
"""

from __future__ import annotations

import io
import sys
import types
from typing import Any

import torch
from opforge.harness.guard import GuardState, config_state, guard_all_threads, pin_config
from opforge.harness.server import Server
from opforge.harness.timing_tamper import TimingSnapshot


def setup(msg: dict[str, Any], blob: bytes | None) -> tuple[Server | None, dict[str, Any], None]:
    """Build the candidate (see the module docstring). Returns (server, reply, None); a candidate that does
    not import or build gives (None, ``{"ok": False, "status": "load_error" | "oom", ...}``, None)."""
    import importlib.util

    from opforge.engine.execution import is_oom

    device = msg["device"]
    if device == "cuda" and not torch.cuda.is_available():
        return None, {"ok": False, "status": "load_error", "error": "device 'cuda' asked for, no GPU visible"}, None
    from opforge.engine.protocol import unpack_pair
    from opforge.harness.slots import map_slots

    raw, ipc = unpack_pair(blob or b"")
    payload = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True) if raw else {}
    init_inputs = payload.get("init_inputs", [])
    state_dict = payload.get("state", {})
    pinned = pin_config(msg["threads"], msg["allow_tf32"])
    timing = TimingSnapshot()  # before any candidate code is imported
    server = Server(device)
    server.slots = map_slots(msg["slots"], ipc)
    state = GuardState(tuple(msg["namespaces"]))
    guard_all_threads(state)
    try:
        if msg.get("module_path"):
            spec = importlib.util.spec_from_file_location("opforge_kernels", msg["module_path"])
            ext = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ext)
            sys.modules["opforge_kernels"] = ext
        mod = types.ModuleType("model_new")
        mod.__file__ = "model_new.py"
        sys.modules["model_new"] = mod
        exec(compile(msg["model_new"], "model_new.py", "exec"), mod.__dict__)  # noqa: S102 - this sandbox
        if not hasattr(mod, "ModelNew"):
            raise AttributeError("model_new.py defines no ModelNew")
        torch.manual_seed(int(msg["seed"]))
        with torch.device(device):
            model = mod.ModelNew(*init_inputs)
        state.construct = False
        missing: list[str] = []
        if isinstance(model, torch.nn.Module):
            model = model.to(device).eval()
            if state_dict:
                result = model.load_state_dict(state_dict, strict=False)
                if len(result.missing_keys) == len(model.state_dict()) and model.state_dict():
                    raise ValueError("none of the reference weights could be loaded into ModelNew "
                                     f"(reference keys: {sorted(state_dict)[:5]})")
                missing = list(result.missing_keys)
            server.owned = {f"weight.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    except BaseException as exc:  # noqa: BLE001 - the candidate does not import or build (a guard stop too)
        status = "oom" if isinstance(exc, Exception) and is_oom(exc) else "load_error"
        return None, {"ok": False, "status": status, "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                      "violations": list(state.violations), "timing": timing.changes()}, None
    server.targets["candidate"] = model

    def findings() -> dict[str, Any]:
        now = config_state()
        return {"violations": list(state.violations), "config": sorted(k for k, v in now.items() if pinned[k] != v),
                "timing": timing.changes()}

    server.after_call = findings
    return server, {"ok": True, "config": pinned, "weights_missing": missing, **findings()}, None
