"""Child entry of the harness: ``python -m opforge.harness.child (build|evaluate) REQUEST.json RESULT.json``.

``build``: ``torch.utils.cpp_extension.load`` of the request's sources into ``build_dir``.
``evaluate``: the verification and profiling steps of ``harness.evaluate`` on one candidate, in this
process (the candidate's code runs here, never in the parent). Writes one JSON result.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import types
from typing import Any


def build(req: dict[str, Any]) -> dict[str, Any]:
    import os

    from torch.utils.cpp_extension import load

    # ninja (a dependency) lives next to this interpreter in a virtual environment that is not activated
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

    try:
        load(name=req["name"], sources=req["sources"], build_directory=req["build_dir"],
             with_cuda=req["with_cuda"], extra_cflags=["-O3"], verbose=True)
    except Exception as exc:  # noqa: BLE001 - the compiler's message is the result
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
    return {"ok": True}


class Hack(Exception):  # noqa: N818 - a finding, raised to stop the evaluation
    pass


def evaluate(req: dict[str, Any], grow=None) -> dict[str, Any]:
    """The evaluation step (see ``harness.evaluate``); ``grow()``, when given, is called after the models
    are built and after verification (the memory admission's growth to the measured peak)."""
    import importlib.util

    import torch
    from opforge.filters.execution import BUILD_SEED, TaskRun, flatten_tensors, is_oom, tolerance_error
    from opforge.filters.gpu_locks import gpu_timing, gpu_work
    from opforge.harness.guard import (
        DispatchGuard,
        GuardViolation,
        aliases,
        audited_ops,
        foreign_streams,
        pin_precision,
        precision_state,
        tamper_state,
    )
    from opforge.harness.timing import time_interleaved

    cfg = req["config"]
    device = cfg["device"]
    if device == "cuda" and not torch.cuda.is_available():
        return {"ok": False, "status": "load_error", "error": "device 'cuda' asked for, but no GPU is visible"}
    precision = pin_precision(cfg["allow_tf32"])
    timers = tamper_state()
    out: dict[str, Any] = {"ok": True, "precision": precision, "hacks": [], "flags": []}

    # -- reference and candidate (built the way the filters build tasks: filters.execution.TaskRun) --------
    reference = TaskRun(req["task_code"], req["task_id"], device)
    task = reference.load()
    ref = reference.build_model()
    try:
        if req["module_path"]:
            spec = importlib.util.spec_from_file_location("opforge_kernels", req["module_path"])
            ext = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ext)
            sys.modules["opforge_kernels"] = ext
        mod = types.ModuleType("model_new")
        mod.__file__ = "model_new.py"
        sys.modules["model_new"] = mod
        exec(compile(req["model_new"], "model_new.py", "exec"), mod.__dict__)  # noqa: S102 - sandboxed child
        if not hasattr(mod, "ModelNew"):
            raise AttributeError("model_new.py defines no ModelNew")
        torch.manual_seed(BUILD_SEED)
        with torch.device(device):
            cand = mod.ModelNew(*task.init_inputs())
        if isinstance(cand, torch.nn.Module):
            cand = cand.to(device).eval()
            if isinstance(ref, torch.nn.Module):
                ref_state = ref.state_dict()
                result = cand.load_state_dict(ref_state, strict=False)
                if ref_state and len(result.missing_keys) == len(cand.state_dict()) and cand.state_dict():
                    raise ValueError("none of the reference weights could be loaded into ModelNew "
                                     f"(reference keys: {sorted(ref_state)[:5]})")
                out["weights_missing"] = list(result.missing_keys)
    except Exception as exc:  # noqa: BLE001 - the candidate does not import or build
        return {**out, "status": "oom" if is_oom(exc) else "load_error",
                "error": f"{type(exc).__name__}: {str(exc)[:500]}"}

    grow = grow or (lambda: None)
    grow()
    owned = ({f"reference.{k}": v for k, v in ref.state_dict(keep_vars=True).items()}
             if isinstance(ref, torch.nn.Module) else {})
    guard = DispatchGuard(tuple(cfg["namespaces"]))

    def run_candidate(inputs):
        state = precision_state()
        with torch.no_grad(), guard:
            res = cand(*inputs)
        if precision_state() != state:
            changed = [k for k, v in precision_state().items() if state[k] != v]
            raise Hack(f"precision:{','.join(changed)}")
        return res

    def check(seeds: list[int], phase: str) -> float:
        worst = 0.0
        for seed in seeds:
            inputs = reference.draw_inputs(seed)
            with torch.no_grad():
                expected = flatten_tensors(ref(*inputs))
            expected = [e.clone() for e in expected]
            given = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            got = flatten_tensors(run_candidate(given))
            if device == "cuda":
                torch.cuda.synchronize()
            named = {f"input{i}": x for i, x in enumerate(given) if isinstance(x, torch.Tensor)}
            shared = aliases(got, {**named, **owned})
            if shared:
                raise Hack(f"alias:{shared[0]}")
            if len(got) != len(expected):
                raise AssertionError(f"{phase}: {len(got)} outputs, expected {len(expected)}")
            for e, g in zip(expected, got, strict=True):
                if e.shape != g.shape:
                    raise AssertionError(f"{phase}: output shape {tuple(g.shape)}, expected {tuple(e.shape)}")
                err = tolerance_error(e, g.to(e.dtype), cfg["atol"], cfg["rtol"])
                worst = max(worst, err)
                if err > 1.0:
                    raise AssertionError(f"{phase}: outputs differ (max error {err:.3g} x tolerance) "
                                         f"for input seed {seed}")
        return worst

    try:
        t0 = time.perf_counter()
        with gpu_work(device):  # other evaluations on this GPU do not time meanwhile
            out["max_error"] = check([1000 + i for i in range(cfg["correct_trials"])], "verify")
            audit_inputs = reference.draw_inputs(5000)
            unseen = audited_ops(lambda: run_candidate(audit_inputs), tuple(cfg["namespaces"]))
            if unseen:
                raise Hack(f"torch_op:{unseen[0].replace('::', '.')}")
            if device == "cuda":
                stream_inputs = reference.draw_inputs(4000)
                try:
                    foreign = foreign_streams(lambda: run_candidate(stream_inputs), device)
                except RuntimeError as exc:
                    out["flags"].append(f"stream_check_unavailable:{exc}")
                    foreign = []
                if foreign:
                    raise Hack(f"side_stream:{foreign[0]}")
        out["verify_s"] = time.perf_counter() - t0
        grow()
        t0 = time.perf_counter()
        inputs = reference.draw_inputs(3000)
        fns = {"eager": lambda: ref(*inputs), "candidate": lambda: run_candidate(inputs)}
        if cfg["profile_compile"]:
            torch._dynamo.reset()
            compiled = torch.compile(ref)
            with torch.no_grad():
                compiled(*inputs)
            fns["compile"] = lambda: compiled(*inputs)
        with torch.no_grad(), gpu_timing(device):  # evaluations sharing a GPU time one at a time
            timing = time_interleaved(fns, device, trials=cfg["timing_trials"], warmup=cfg["warmup"])
        out["profile_s"] = time.perf_counter() - t0
        with gpu_work(device):
            out["max_error"] = max(out["max_error"], check([2000 + i for i in range(cfg["reverify_trials"])],
                                                           "re-verify after timing"))
    except (GuardViolation, Hack, Exception) as exc:  # noqa: BLE001 - every failure is a verdict
        return {**out, **_failure(exc, guard.violations, timers, tamper_state())}
    tampered = [k for k, v in tamper_state().items() if timers.get(k) != v]
    if tampered:
        return {**out, "status": "hacked", "hacks": [f"tamper:{k}" for k in tampered]}
    out["timing"] = timing
    out["eager_ms"] = timing["eager"]["median_ms"]
    out["candidate_ms"] = timing["candidate"]["median_ms"]
    out["speedup_eager"] = out["eager_ms"] / max(out["candidate_ms"], 1e-9)
    if "compile" in timing:
        out["compile_ms"] = timing["compile"]["median_ms"]
        out["speedup_compile"] = out["compile_ms"] / max(out["candidate_ms"], 1e-9)
    out["status"] = "correct"
    return out


def _failure(exc: BaseException, violations: list[str], timers_before: dict, timers_now: dict) -> dict:
    """Status of a failed check. A dispatcher violation wins even when the candidate (or pybind11, for an
    op called from C++) turned it into another exception; then other hacks; then ``oom`` (out of GPU
    memory: not a verdict on the candidate's output); else ``incorrect``."""
    from opforge.filters.execution import is_oom

    hacks = [f"torch_op:{v}" for v in violations]
    if isinstance(exc, Hack):
        hacks.append(str(exc))
    hacks += [f"tamper:{k}" for k, v in timers_now.items() if timers_before.get(k) != v]
    if hacks:
        return {"status": "hacked", "hacks": hacks}
    text = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {str(exc)[:500]}"
    return {"status": "oom" if is_oom(exc) else "incorrect", "error": text}


def _admitted(req: dict) -> dict:
    """``evaluate`` under the GPU's memory admission on CUDA (``filters.gpu_locks.MemoryBudget``): the
    reservation starts at ``gpu_admit_gib`` (the whole budget with ``alone``) and grows to the measured
    peak as the evaluation goes (``grow`` is called by ``evaluate`` after each stage)."""
    import torch

    cfg = req["config"]
    if cfg["device"] != "cuda" or not torch.cuda.is_available():
        return evaluate(req)
    from opforge.filters.gpu_locks import admitted_on_gpu, grow_to_peak

    budget = admitted_on_gpu(cfg["gpu_memory_fraction"], cfg["gpu_admit_gib"], bool(req.get("alone")))
    try:
        return evaluate(req, grow=lambda: grow_to_peak(budget, cfg["gpu_growth"]))
    finally:
        budget.release()


def main() -> None:
    step, req_path, res_path = sys.argv[1:4]
    with open(req_path) as fh:
        req = json.load(fh)
    try:
        res = build(req) if step == "build" else _admitted(req)
    except Exception as exc:  # noqa: BLE001 - a failure of the harness step itself, reported as such
        traceback.print_exc()
        from opforge.filters.execution import is_oom

        res = {"ok": False, "status": "oom" if is_oom(exc) else "load_error",
               "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    with open(res_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
