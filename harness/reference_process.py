"""The reference's side of the grader: a server process that never imports candidate code
(``harness.server``, role ``reference``).

Setup: on CUDA, admission of the whole evaluation to the GPU's memory budget (``harness.gpu_memory``: predicted
on fake tensors before any GPU work, grown to the measured layouts and peak after setup); pin the same
runtime settings as the candidate's server (``harness.guard.pin_config``) and Inductor's ``compile_threads``
to ``COMPILE_THREADS``, load the task
(``opforge.task.source.load_task``), build ``Model(*get_init_inputs())`` after ``torch.manual_seed(seed)``
(a seed the grader draws per evaluation) and run it once on one draw of inputs to learn the output layout.
Reply: the input layout (per position: a tensor's shape and dtype, or a JSON value), the output layout and
``burst``: on CUDA the most calls a burst may have (the slot sets the grader allocates for bursts,
``_burst_sets``), on CPU the calls per warm-up and timed burst (``_burst``, measured here);
blob: ``torch.save`` bytes of ``{"init_inputs", "state"}`` for the candidate's server.

Hidden shape variants (``variants`` in the setup message, each a dict of size-constant values): inputs drawn
from the task source with those values (``task.sizes.with_sizes``); the same ``Model`` and weights run on them.
The reply lists each variant's input and output layouts, or its error.

Targets: ``eager`` (the model) and ``compile`` (``torch.compile(model)``, Inductor default mode, compiled on
its first call). On CUDA the compiler's one-time start that needs no CUDA context (``warm_compiler``) runs in a
thread from the admission's wait for GPU memory on, beside that wait, the setup and the candidate's setup and first
call; it is joined before this server's first ``call`` and its ``size`` step, so no CUDA graph capture, timing or
compile runs beside it. ``draw``: ``get_inputs()`` (of variant ``variant`` when the message names one) after
``torch.manual_seed(seed)`` for each of the message's ``seeds``, its tensors copied into the grader's slots
``slots`` (per seed, one slot index per tensor, in order; slots of this server's set, so a draw never crosses
the socket); reply: each set's layout (JSON values included) and ``copied``. ``size`` (CUDA): the calls per
warm-up and timed burst (``_burst``: eager timed on that draw), asked by the grader while it holds the device's
timing lock exclusively, so the size does not depend on what neighbouring evaluations run at the time; reply
``burst``.

Between evaluations of a long-lived grader (``harness.warm``): ``idle`` releases the slots and their CUDA graphs,
empties the allocator cache and shrinks the reservation to what the process still holds (reply: ``gib``, and on
CUDA the evaluation's ``full_gib`` and the budget's ``capacity_gib``); ``admit`` takes the evaluation's whole
reservation again (waiting); ``setup`` with the same fields but the seed (``SETUP_KEYS``) draws the weights again
in place (``reseed``) and replies as the first setup did; a setup the server cannot serve so is refused
(``reusable: false``).
"""

from __future__ import annotations

import gc
import io
import json
import threading
from typing import Any

import torch
from opforge.harness.guard import config_state, pin_config
from opforge.harness.server import Server, noop
from opforge.harness.timing_tamper import TimingSnapshot

# Inductor compile_threads of the reference server (see setup)
COMPILE_THREADS = 1


def _compiler_start() -> None:
    import torch._inductor.compile_fx  # noqa: F401 - Inductor's modules (their import initialises the CUDA driver)
    from torch._inductor.codecache import CacheBase, torch_key

    torch_key()  # a hash of torch's sources, cached for the process
    CacheBase.get_system()  # Triton's and the GPU's versions
    import triton

    triton.runtime.driver.active.get_current_target()  # Triton's CUDA driver utilities


_WARMING: dict[str, threading.Thread] = {}


def warm_compiler() -> threading.Thread:
    """Start (once per process) the part of the first ``torch.compile``'s one-time cost that needs no CUDA context,
    in a daemon thread: Inductor's imports, Inductor's cache keys of torch and of the system, Triton's CUDA driver
    utilities. On one idle H200 a process's first compile of a fused elementwise task took 2.6 s and its next
    task's 0.35 s; taken alone in a fresh process these steps took 0.3-1.4 s each and made no CUDA context
    (``benchmarks/results/h200/compile_probe.json``). Best effort: a step that fails (another torch or Triton
    version, no Triton) is left to the compile itself. Returns the thread; ``compiler_warm()`` joins it."""
    thread = _WARMING.get("thread")
    if thread is None:
        def run() -> None:
            try:
                _compiler_start()
            except Exception:  # noqa: BLE001 - a warm-up only: the compile pays what this did not
                pass

        thread = _WARMING["thread"] = threading.Thread(target=run, name="opforge-warm-compiler", daemon=True)
        thread.start()
    return thread


def compiler_warm() -> None:
    """Wait for ``warm_compiler``'s thread when one was started (before the server's first call, its ``size`` step
    and the first ``torch.compile``: no CUDA graph capture, timing or compile runs beside it)."""
    thread = _WARMING.get("thread")
    if thread is not None:
        thread.join()


def _layout(values: list[Any], where: str) -> list[dict[str, Any]]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            out.append({"tensor": True, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")})
        else:
            try:
                json.dumps(v)
            except TypeError:
                raise TypeError(f"{where}[{i}] is a {type(v).__name__}: only tensors and JSON values "
                                "can be passed to the candidate") from None
            out.append({"tensor": False, "value": v})
    return out


def _save(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def setup(msg: dict[str, Any], blob: bytes | None) -> tuple[Server, dict[str, Any], bytes]:
    """Build the reference (see the module docstring). Raises what the task raises (a broken task)."""
    import torch._inductor.config as inductor_config
    from opforge.engine.execution import flatten_tensors
    from opforge.task.source import load_task

    device = msg["device"]
    pinned = pin_config(msg["threads"], msg["allow_tf32"])
    # Inductor compiles the compile baseline's kernels in this process, as the filter stage's sandboxes do
    # (engine.settings: compile_threads 1): a pool of compile processes per evaluation would put one process
    # per core next to every neighbour's timing (16 of ~380 MB each per reference server on a 16-core H200 host)
    inductor_config.compile_threads = COMPILE_THREADS
    budget = (_ADMITTED.get("budget") or admit(msg)["budget"]) if device == "cuda" else None
    task = load_task(msg["task_code"], msg["task_id"])
    torch.manual_seed(int(msg["seed"]))
    with torch.device(device):
        init_inputs = list(task.init_inputs())
        model = task.build()
    if isinstance(model, torch.nn.Module):
        model = model.to(device).eval()

    def draw(seed: int) -> list[Any]:
        torch.manual_seed(int(seed))
        with torch.device(device):
            return [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.inputs()]

    sample = draw(int(msg["seed"]) ^ 1)
    with torch.no_grad():
        outputs = flatten_tensors(model(*sample))
    if not outputs:
        raise TypeError("the task's forward returned no tensor")
    in_layout = _layout(sample, "get_inputs()")
    out_layout = [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")} for o in outputs]
    # CUDA: slot sets for the longest burst, sized later under the exclusive lock (``size``); CPU: sized here (its
    # slots are files in /dev/shm, too many to allocate for the longest burst of a large task)
    burst = _burst_sets(msg, in_layout, out_layout) if device == "cuda" else \
        _burst(model, sample, device, msg, in_layout, out_layout)
    variants = _variants(msg, model, device)
    del outputs
    # the evaluation's seed (a warm server's next setup draws another): the ``size`` step draws its sample from it
    current = {"seed": int(msg["seed"])}
    if device == "cuda":
        del sample  # not kept: an idle warm server holds as little memory as it can (harness.warm)
    server = Server(device)
    server.targets["eager"] = model
    compiled: dict[str, Any] = {}

    def compile_target(*args):
        if "fn" not in compiled:
            compiler_warm()
            torch._dynamo.reset()
            compiled["fn"] = torch.compile(model)
        return compiled["fn"](*args)

    server.targets["compile"] = compile_target

    def handle_draw(m: dict[str, Any], _blob) -> tuple[dict[str, Any], None]:
        v = m.get("variant")
        sets = [draw(s) if v is None else variants[v]["draw"](s) for s in m["seeds"]]
        layouts = [_layout(s, "get_inputs()") for s in sets]
        return {"ok": True, "layouts": layouts, "copied": _into_slots(server, sets, m["slots"])}, None

    server.handlers["draw"] = handle_draw

    def handle_size(m: dict[str, Any], _blob) -> tuple[dict[str, Any], None]:
        compiler_warm()  # eager is captured and timed here: the warm-up never runs beside it
        return {"ok": True, "burst": min(burst, _burst(model, draw(current["seed"] ^ 1), device, msg, in_layout,
                                                        out_layout, graph=bool(m.get("graph"))))}, None

    server.handlers["size"] = handle_size
    # the same per-call bookkeeping as the candidate's server (its timing snapshot included, its findings unused),
    # so both sides' requests cost the same
    snapshot = TimingSnapshot()
    server.after_call = lambda: {"violations": [], "config": sorted(k for k, v in config_state().items()
                                                                    if pinned[k] != v),
                                 "timing": snapshot.changes()}
    if budget is not None:
        _grow(budget, msg, in_layout, out_layout, variants, burst)

    def warmed() -> None:  # the first call waits for the compiler's warm-up (then nothing, as the candidate's)
        compiler_warm()
        server.before_call = noop

    server.before_call = warmed
    reply = {"ok": True, "config": pinned, "inputs": in_layout, "outputs": out_layout, "burst": burst,
             "variants": [{k: v for k, v in var.items() if k != "draw"} for var in variants],
             "gib": budget.held_gib if budget is not None else 0.0}

    def handle_setup(m: dict[str, Any], _blob) -> tuple[dict[str, Any], bytes | None]:
        # a warm server's next evaluation (harness.warm): the same task and settings, weights drawn again
        changed = [k for k in SETUP_KEYS if m.get(k) != msg.get(k)]
        if changed:
            return {"ok": False, "reusable": False, "error": f"a warm reference serves another setup ({changed})"}, None
        again = reseed(task, model, int(m["seed"]), device)
        if again is None or not _same_values(again, init_inputs):
            return {"ok": False, "reusable": False, "error": "the task's init inputs or weights' structure depend "
                                                            "on the seed"}, None
        current["seed"] = int(m["seed"])
        server.slots = []
        # on CPU the burst is measured at each setup, as a fresh server measures it (on CUDA: the ``size`` step)
        calls = burst if device == "cuda" else _burst(model, draw(current["seed"] ^ 1), device, msg, in_layout,
                                                       out_layout)
        return {**reply, "burst": calls, "gib": budget.held_gib if budget is not None else 0.0}, \
            _save({"init_inputs": again, "state": _state(model)})

    full = {"gib": budget.held_gib if budget is not None else 0.0}  # the evaluation's reservation

    def handle_idle(_m: dict[str, Any], _blob) -> tuple[dict[str, Any], None]:
        # between evaluations (harness.warm): the slots and their graphs released, the cache emptied, and the
        # reservation shrunk to what this process still holds (its model, compiled graph and CUDA context)
        server.graphs.clear()
        server.graph_error.clear()
        server.slots = []
        gc.collect()
        if budget is None:
            return {"ok": True, "gib": 0.0}, None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        full["gib"] = max(full["gib"], budget.held_gib)
        from opforge.harness.gpu_memory import CONTEXT_BYTES

        budget.resize((torch.cuda.memory_reserved() + CONTEXT_BYTES) / 2**30)
        return {"ok": True, "gib": budget.held_gib, "full_gib": full["gib"], "capacity_gib": budget.capacity_gib,
                "waiting": budget.usage()[1]}, None

    def handle_admit(_m: dict[str, Any], _blob) -> tuple[dict[str, Any], None]:
        # an idle warm server's next evaluation: the whole reservation again, waiting as a first admission does
        if budget is not None and budget.held_gib < full["gib"]:
            budget.release()
            budget.admit(full["gib"])
        return {"ok": True, "gib": full["gib"]}, None

    server.handlers["setup"] = handle_setup
    server.handlers["idle"] = handle_idle
    server.handlers["admit"] = handle_admit
    return server, reply, _save({"init_inputs": init_inputs, "state": _state(model)})


# the setup message's fields a warm reference server must share with its first setup to serve another evaluation
# (harness.warm); the seed is drawn again
SETUP_KEYS = ("task_code", "task_id", "variants", "device", "threads", "allow_tf32", "input_sets",
              "burst_target_ms", "burst_calls", "cuda_graphs", "gpu_memory_fraction", "gpu_admit_gib")


def _same_values(a: Any, b: Any) -> bool:
    """Whether two init-input values are equal: tensors by dtype, shape and value, lists and tuples item by item,
    anything else by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu())))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return False


def _state(model) -> dict[str, torch.Tensor]:
    """The weights the candidate's server loads: ``model``'s state dict on the CPU ({} for a function)."""
    if not isinstance(model, torch.nn.Module):
        return {}
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def reseed(task, model, seed: int, device: str) -> list[Any] | None:
    """Draw the task's weights again for a new evaluation, in place: ``Model(*get_init_inputs())`` is built
    after ``torch.manual_seed(seed)`` exactly as ``setup`` builds it, and every parameter and buffer of the new
    model (non-persistent ones included) is copied into ``model``'s own tensors, so ``model``, its compiled
    ``torch.compile`` graph and the addresses of its weights stay the same. Returns the new init inputs, or None
    when the new model's tensors differ from ``model``'s in names, shapes or dtypes (or either is not an
    ``nn.Module``): the caller then starts a fresh reference."""
    torch.manual_seed(int(seed))
    with torch.device(device):
        init_inputs = list(task.init_inputs())
        fresh = task.build()
    if not isinstance(fresh, torch.nn.Module) or not isinstance(model, torch.nn.Module):
        return None
    fresh = fresh.to(device)

    def tensors(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers(remove_duplicate=False))}

    old, new = tensors(model), tensors(fresh)
    if list(old) != list(new) or any(old[k].shape != new[k].shape or old[k].dtype != new[k].dtype for k in old):
        return None
    with torch.no_grad():
        for k, t in old.items():
            t.copy_(new[k])
    if device == "cuda":
        torch.cuda.synchronize()
    return init_inputs


def _burst_sets(msg: dict[str, Any], in_layout: list[dict[str, Any]], out_layout: list[dict[str, Any]]) -> int:
    """The most calls a warm-up or timed burst of the setup message ``msg`` may have: ``burst_calls`` when set,
    else ``engine.timing.burst_cap`` of one input + output set's bytes when ``burst_target_ms`` is on, else 1;
    ``_burst`` never asks for more."""
    from opforge.engine.timing import burst_cap
    from opforge.harness.gpu_memory import layout_bytes

    cap = burst_cap(layout_bytes(in_layout) + layout_bytes(out_layout))
    if msg.get("burst_calls"):
        return min(int(msg["burst_calls"]), cap)
    return cap if float(msg.get("burst_target_ms") or 0.0) > 0 else 1


def _burst(model, sample: list[Any], device: str, msg: dict[str, Any], in_layout: list[dict[str, Any]],
           out_layout: list[dict[str, Any]], graph: bool = False) -> int:
    """Calls per burst (``engine.timing.burst_size``) for eager's call on ``sample``, the bytes of one input +
    output set and the message's ``burst_target_ms``; or the message's ``burst_calls`` when set (capped by
    ``burst_cap``). Eager's time per call is measured the way a burst runs: one untimed and one timed warm call,
    then up to two bursts
    of the size the fastest estimate so far gives (each call's time is its burst's divided by its calls), so the
    synchronisation's fixed cost does not count as a call's and a short call is not given too few calls.
    ``graph`` (CUDA): the calls are replays of a CUDA graph of one call (``engine.timing.capture_burst``), as the
    grader's bursts are when it uses graphs; plain calls when eager cannot be captured."""
    from opforge.engine.timing import burst_cap, burst_size, capture_burst, run_burst
    from opforge.harness.gpu_memory import layout_bytes

    target = float(msg.get("burst_target_ms") or 0.0)
    set_bytes = layout_bytes(in_layout) + layout_bytes(out_layout)
    if msg.get("burst_calls"):
        return min(int(msg["burst_calls"]), burst_cap(set_bytes))
    if target <= 0:
        return 1
    cuda = device == "cuda"
    with torch.no_grad():
        one = lambda: model(*sample)  # noqa: E731
        if graph and cuda:
            captured, _ = capture_burst(one)
            if captured is not None:
                one = captured.replay
        run_burst([one], cuda)  # untimed: a graph's first replay (its upload) and a clock still rising are slow
        per_call = run_burst([one], cuda)
        for _ in range(2):
            n = burst_size(per_call, set_bytes, target)
            if n == 1:
                break
            per_call = min(per_call, run_burst([one] * n, cuda) / n)
    return burst_size(per_call, set_bytes, target)


def _into_slots(server: Server, sets: list[list[Any]], targets: list[list[int]]) -> bool:
    """Copy each drawn set's tensors into the grader's slots ``targets`` (per set, the slot index of each
    tensor in order), then synchronise the device. False, and nothing copied, when a set's tensors do not
    match their slots in count, shape and dtype (the grader's layout check names the fault)."""
    if len(sets) != len(targets):
        return False
    pairs = []
    for values, idx in zip(sets, targets, strict=True):
        tensors = [x for x in values if isinstance(x, torch.Tensor)]
        if len(tensors) != len(idx):
            return False
        for i, x in zip(idx, tensors, strict=True):
            slot = server.slots[i]
            if slot.shape != x.shape or slot.dtype != x.dtype:
                return False
            pairs.append((slot, x))
    for slot, x in pairs:
        slot.copy_(x)
    if server.device == "cuda":
        torch.cuda.synchronize()
    return True


_ADMITTED: dict[str, Any] = {}  # this process's admission (one evaluation per process)


def admit(msg: dict[str, Any]) -> dict[str, Any]:
    """Admit the whole evaluation to the GPU's memory budget (``harness.gpu_memory``), held until this
    process exits: the bytes predicted on fake tensors for the public shape and each variant, ``gpu_admit_gib``
    when the prediction fails, the whole budget for an ``oom`` re-run (``alone``). ``msg``: the setup
    message's fields (``task_code``, ``task_id``, ``variants``, ``input_sets``, ``cuda_graphs``, ``gpu_memory_fraction``,
    ``gpu_admit_gib``, ``alone``). The grader sends it as a message of its own (``admit``) before it holds any
    lock of the device, so an evaluation waiting for memory never holds up one that holds memory and waits
    for the device. Returns ``{"budget": MemoryBudget, "gib": reserved GiB, "waited_s": seconds spent waiting for
    it}``."""
    budget = _admit(msg)
    _ADMITTED["budget"] = budget
    return {"budget": budget, "gib": budget.held_gib, "waited_s": round(budget.waited_s, 3)}


def _admit(msg: dict[str, Any]):
    import torch
    from opforge.engine.gpu_locks import memory_budget

    budget = memory_budget(msg["gpu_memory_fraction"] * torch.cuda.get_device_properties(0).total_memory / 2**30)
    need = None if msg.get("alone") else predicted_need_gib(msg, "cuda")
    # from here this thread imports nothing until the setup, and the setup nothing of Inductor's or Triton's that is
    # not loaded already: the warm-up's imports run beside no import that could close a circle with theirs
    warm_compiler()
    if msg.get("alone"):
        budget.admit(budget.capacity_gib)
    else:
        budget.admit(float(msg["gpu_admit_gib"]) if need is None else need)
    return budget


def public_sets(msg: dict[str, Any], set_bytes: int) -> int:
    """Slot sets of the public shape the grader may allocate (``harness.gpu_memory.slot_sets`` of ``input_sets``,
    the longest burst - ``engine.timing.burst_cap`` of one input + output set's bytes when ``burst_target_ms`` is
    on, else 1 - and ``cuda_graphs``)."""
    from opforge.engine.timing import burst_cap
    from opforge.harness.gpu_memory import slot_sets

    bursts = float(msg.get("burst_target_ms") or 0.0) > 0 or msg.get("burst_calls")
    return slot_sets(int(msg.get("input_sets") or 4), burst_cap(set_bytes) if bursts else 1,
                     bool(msg.get("cuda_graphs")))


def predicted_need_gib(msg: dict[str, Any], device: str) -> float | None:
    """GiB the evaluation of ``msg`` (``task_code``, ``task_id``, ``variants``, ``input_sets``) will hold on
    ``device``: ``harness.gpu_memory.evaluation_bytes`` over fake-tensor runs of the public shape
    (``input_sets`` sets) and of each variant (``VARIANT_SETS`` sets; a variant the task cannot take or fake
    tensors cannot run is left out), or None when the public shape cannot be predicted."""
    from opforge.engine.memory_estimate import predict_footprint
    from opforge.harness.gpu_memory import VARIANT_SETS, Shape, evaluation_bytes
    from opforge.task.sizes import with_sizes

    public = predict_footprint(msg["task_code"], device, str(msg.get("task_id")))
    if public is None:
        return None
    shapes = [Shape(public_sets(msg, public.inputs + public.outputs), public.inputs, public.outputs, public.peak)]
    for sizes in msg.get("variants") or []:
        try:
            fp = predict_footprint(with_sizes(msg["task_code"], sizes), device, str(msg.get("task_id")))
        except Exception:  # noqa: BLE001 - a variant the task cannot take is dropped at setup too
            continue
        if fp is not None:
            shapes.append(Shape(VARIANT_SETS, fp.inputs, fp.outputs, fp.peak))
    return evaluation_bytes(shapes) / 2**30


def _grow(budget, msg: dict[str, Any], in_layout: list[dict[str, Any]], out_layout: list[dict[str, Any]],
          variants: list[dict[str, Any]], burst: int) -> None:
    """Fit the evaluation's reservation (never waiting) to ``harness.gpu_memory.evaluation_bytes`` over the
    measured layouts (the public shape's ``in_layout`` / ``out_layout`` and each variant's) and this process's
    measured peak: grown when that is more than was admitted; shrunk by the slot sets admitted for a burst
    longer than ``burst`` (the public shape's ``public_sets`` less ``gpu_memory.slot_sets`` for ``burst``)."""
    from opforge.harness.gpu_memory import VARIANT_SETS, Shape, evaluation_bytes, layout_bytes, slot_sets

    peak = torch.cuda.max_memory_reserved()
    ins, outs = layout_bytes(in_layout), layout_bytes(out_layout)
    rest = [Shape(VARIANT_SETS, layout_bytes(v["inputs"]), layout_bytes(v["outputs"]), peak)
            for v in variants if "error" not in v]
    used = slot_sets(int(msg.get("input_sets") or 4), burst, bool(msg.get("cuda_graphs")))
    gib = evaluation_bytes([Shape(used, ins, outs, peak), *rest]) / 2**30
    unused = (evaluation_bytes([Shape(public_sets(msg, ins + outs), ins, outs, peak), *rest]) / 2**30) - gib
    fit = max(gib, budget.held_gib - unused)
    if fit != budget.held_gib:
        budget.resize(fit)


def _variants(msg: dict[str, Any], model, device: str) -> list[dict[str, Any]]:
    """Per hidden shape variant of the setup message (``variants``: size-constant values, ``compose.variants``):
    ``draw`` (seed -> inputs from the task source with those values, ``task.sizes.with_sizes``), the input and
    output layouts from one run of ``model`` on them; or ``error`` when that fails (the grader drops it)."""
    from opforge.engine.execution import flatten_tensors
    from opforge.task.sizes import with_sizes
    from opforge.task.source import load_task

    out: list[dict[str, Any]] = []
    for j, sizes in enumerate(msg.get("variants") or []):
        try:
            vtask = load_task(with_sizes(msg["task_code"], sizes), f"{msg['task_id']}#variant{j}")

            def draw(seed: int, vtask=vtask) -> list[Any]:
                torch.manual_seed(int(seed))
                with torch.device(device):
                    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in vtask.inputs()]

            sample = draw(int(msg["seed"]) ^ (j + 2))
            with torch.no_grad():
                outs = flatten_tensors(model(*sample))
            out.append({"draw": draw, "inputs": _layout(sample, f"variant {j} get_inputs()"),
                        "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")}
                                    for o in outs]})
            del sample, outs
        except Exception as exc:  # noqa: BLE001 - a variant the reference cannot run is dropped, not the task
            out.append({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return out
