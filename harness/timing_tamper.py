"""Timing tamper: what a candidate may not patch, wrap or read to meddle with the timing of its calls.

A candidate that patches or wraps a timing, synchronisation, event or statistics function, or that changes
its behaviour by call count, by seed or by recognising an earlier input (ways to tell warm-up from timed
calls), is ``hacked`` (labels ``timing:<kind>:<what>``) whether or not the patch could change a time: the
grader's times are its own (``harness.grader``), but an attempt on the timing is an attack and is recorded
as one. Two checks, one in the grader and one in the candidate's process:

* ``timing_tampers(source)``: an AST audit of ``model_new.py`` (the only Python of a solution), run by the
  grader before anything is built or started. Kinds:

  - ``patch``: an assignment, ``del``, ``setattr`` / ``delattr`` (literal name) or ``unittest.mock`` patch of
    an attribute of a timing object (``timing_target``: anything under ``time``, ``statistics``, ``numpy``,
    ``torch.cuda``, ``torch.accelerator``, ``torch.cpu``; ``torch.Event`` / ``torch.Stream``; the statistics
    functions ``STAT_NAMES`` of ``torch`` and ``torch.Tensor``), owners resolved through import aliases and
    plain ``name = dotted`` assignments; or of an attribute named in ``TIMING_ATTRS`` on any object but
    ``self`` (``type(ev).elapsed_time = f``);
  - ``wrap``: a timing object passed to a ``functools`` function (``wraps``, ``partial``, ``update_wrapper``...);
  - ``subclass``: a class deriving from a timing object (``class E(torch.cuda.Event)``);
  - ``seed``: a read of the RNG seed or state (``SEED_ATTRS``: ``torch.initial_seed()``,
    ``torch.get_rng_state()``, ``random.getstate()``, ``Generator.get_state()``...; ``torch.seed``);
  - ``call_count``: state that outlives a call (an attribute of ``self``, of the class, or a module-level
    name or container) incremented outside ``__init__`` (``+=`` / ``-=``, ``x = x + 1``, ``x = getattr(self,
    "x", 0) + 1``, ``next()`` of an ``itertools.count``, ``len()`` of a list appended to per call) and read by
    a condition (``if`` / ``while`` / conditional expression / ``assert`` / comprehension filter / ``for``
    range / any comparison), directly or through a local name assigned from it;
  - ``input_identity``: ``id()`` / ``hash()`` / ``weakref`` of a ``forward`` argument, or ``is`` between
    one and kept state; ``input_kept``: a ``forward`` argument (or a copy or view of it: not its shape,
    dtype or device) stored in state that outlives the call.

  A candidate that uses ``time`` for its own logging, ``torch.cuda.synchronize()`` or CUDA events normally,
  rotates buffers by ``(i + 1) % n``, prepares its weights lazily behind a flag, or keeps buffers keyed by
  shape is not flagged.
* ``TimingSnapshot()`` / ``.changes()``: the identities of the functions of ``runtime_targets()``, taken in
  the candidate's process before the extension and ``model_new.py`` are imported and compared after setup
  and after every call (about 10 us on a loaded 2-core machine, inside the call's wall time and outside its
  own time); the names that changed go to the grader in each reply (``timing``) as a hint, and the grader
  decides (``timing:changed:<name>``). It catches what the static audit cannot resolve (a patch through a
  loop variable or a container, an attribute name of no timing meaning); a patch undone within the same
  call is left to the static audit.
"""

from __future__ import annotations

import ast
from typing import Any

from opforge.harness.policy import dotted_name

TIMING_MODULES = ("time", "statistics", "numpy", "torch.cuda", "torch.accelerator", "torch.cpu", "torch.mps",
                  "torch.xpu")
TIMING_OBJECTS = ("torch.Event", "torch.Stream")
STAT_NAMES = ("median", "nanmedian", "mean", "nanmean", "quantile", "nanquantile", "std", "var", "std_mean",
              "var_mean", "sort", "msort", "kthvalue", "topk", "min", "max", "amin", "amax")
# attribute names that are timing whatever object holds them (patching one on anything but self is flagged)
TIMING_ATTRS = frozenset({
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "process_time_ns",
    "thread_time", "thread_time_ns", "time_ns", "clock_gettime", "clock_gettime_ns", "synchronize",
    "elapsed_time", "current_stream", "default_stream", "Event", "Stream", "median", "nanmedian", "quantile",
    "quantiles", "nanquantile", "percentile", "nanpercentile", "fmean", "initial_seed", "get_rng_state",
})
SEED_ATTRS = frozenset({"initial_seed", "get_rng_state", "get_rng_state_all", "getstate", "get_state"})
SEED_CALLS = frozenset({"torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all",
                        "torch.cuda.random.seed"})
# tensor methods and attributes that give the same values (a copy or a view): keeping their result keeps the input
_SAME_DATA = frozenset({
    "clone", "detach", "contiguous", "view", "view_as", "reshape", "reshape_as", "to", "cpu", "cuda", "float",
    "double", "half", "bfloat16", "type", "type_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose",
    "permute", "t", "T", "mT", "expand", "expand_as", "narrow", "select", "as_strided", "movedim", "data",
    "requires_grad_", "detach_", "chunk", "split", "unbind", "real",
})
_GROWTH = frozenset({"append", "add", "insert", "extend", "appendleft"})


def timing_target(dotted: str) -> bool:
    """True when ``dotted`` (a resolved name: ``torch.cuda.Event.elapsed_time``) is a timing object or lies
    under one."""
    if any(dotted == p or dotted.startswith(p + ".") for p in TIMING_MODULES + TIMING_OBJECTS):
        return True
    parts = dotted.split(".")
    return (len(parts) >= 2 and parts[-1] in STAT_NAMES
            and (parts[:-1] == ["torch"] or parts[:-1] == ["torch", "Tensor"]))


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Import aliases (``import time as t``, ``from torch import cuda``) and plain ``name = dotted``
    assignments of imported names, resolved to full dotted names (flow-insensitive)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for _ in range(3):  # chains of plain assignments
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                dotted = dotted_name(node.value, aliases) if isinstance(node.value, (ast.Name, ast.Attribute)) else None
                if dotted and dotted.split(".")[0] in {v.split(".")[0] for v in aliases.values()} \
                        and node.targets[0].id != dotted:
                    aliases[node.targets[0].id] = dotted
    return aliases


def _functions(tree: ast.AST) -> list[tuple[ast.AST, str | None]]:
    """Every function with the name of its class (None at module level or nested in a function)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out += [(f, node.name) for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen = {id(f) for f, _ in out}
    out += [(f, None) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and id(f) not in seen]
    return out


def _params(fn: ast.AST) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names


def _walk_own(fn: ast.AST):
    """Nodes of ``fn``'s body, nested functions and classes included (they run when it runs)."""
    for stmt in fn.body:
        yield from ast.walk(stmt)


class _Scope:
    """What persists across calls as seen from one function: ``self`` (its first parameter in a class), its
    class, and module-level names it does not shadow."""

    def __init__(self, fn: ast.AST, cls: str | None, module_names: set[str]):
        params = _params(fn)
        self.self_name = params[0] if cls and params else None
        self.cls = cls
        declared = {n for node in _walk_own(fn) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}
        local = {n.id for n in _walk_own(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.local = (local | set(params)) - declared
        self.module_names = module_names

    def key(self, node: ast.AST) -> str | None:
        """A stable name for ``node`` when it denotes state that outlives the call (``self.calls``,
        ``_STATE[0]``, ``ModelNew.calls``), else None. ``getattr(self, "x", d)`` is ``self.x``."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            return self.key(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()))
        if not isinstance(node, (ast.Attribute, ast.Subscript, ast.Name)):
            return None
        root = _root(node)
        if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "type" \
                and len(root.args) == 1 and isinstance(root.args[0], ast.Name) and root.args[0].id == self.self_name:
            pass  # type(self).x: a class attribute
        elif not isinstance(root, ast.Name):
            return None
        elif root.id == self.self_name or root.id == self.cls:
            if node is root:
                return None
        elif root.id in self.local or root.id not in self.module_names:
            return None
        try:
            return ast.unparse(node)
        except (ValueError, AttributeError):  # pragma: no cover - unparse of a hand-built node
            return None


def _module_names(tree: ast.Module) -> set[str]:
    """Names bound at module level (assignments, imports, defs, classes) and names any function declares
    ``global``."""
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    names.update(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)
    return names


def _tests(fn: ast.AST) -> list[ast.AST]:
    """The condition expressions of ``fn``: tests of if / while / conditional expressions / assert /
    comprehension filters / match subjects, ``for`` iterables, and every comparison."""
    out: list[ast.AST] = []
    for node in _walk_own(fn):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            out.append(node.test)
        elif isinstance(node, ast.comprehension):
            out += [*node.ifs, node.iter]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            out.append(node.iter)
        elif isinstance(node, ast.Match):
            out.append(node.subject)
        elif isinstance(node, ast.Compare):
            out.append(node)
    return out


def _reads(expr: ast.AST, scope: _Scope, counters: set[str], lengths: set[str],
           tainted: dict[str, str]) -> str | None:
    """The counter ``expr`` reads (directly, through ``len()`` / ``next()`` or a local assigned from it)."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in tainted and isinstance(node.ctx, ast.Load):
            return tainted[node.id]
        key = scope.key(node)
        if key in counters:
            return key
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("len", "next") \
                and node.args:
            inner = scope.key(node.args[0])
            if inner in lengths or (node.func.id == "next" and inner in counters):
                return inner
    return None


def _call_counters(tree: ast.Module, aliases: dict[str, str]) -> list[str]:
    """``call_count:<state>`` findings (see the module docstring)."""
    module_names = _module_names(tree)
    funcs = _functions(tree)
    counters: set[str] = set()
    lengths: set[str] = set()
    scopes = {id(fn): _Scope(fn, cls, module_names) for fn, cls in funcs}
    # itertools.count objects: module-level names and state set in any function
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and dotted_name(node.value.func, aliases) == "itertools.count":
            counters.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for fn, _cls in funcs:
        for node in _walk_own(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and dotted_name(node.value.func, aliases) == "itertools.count":
                counters.update(k for t in node.targets if (k := scopes[id(fn)].key(t)))
    for fn, _cls in funcs:
        if fn.name == "__init__":
            continue
        scope = scopes[id(fn)]
        for node in _walk_own(fn):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
                key = scope.key(node.target)
                if key:
                    counters.add(key)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) \
                    and isinstance(node.value.op, (ast.Add, ast.Sub)):
                for t in node.targets:
                    key = scope.key(t)
                    if key and any(scope.key(n) == key for n in ast.walk(node.value)):
                        counters.add(key)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and len(node.args) == 3 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[2], ast.BinOp) and isinstance(node.args[2].op, (ast.Add, ast.Sub)):
                key = scope.key(ast.Attribute(value=node.args[0], attr=str(node.args[1].value), ctx=ast.Load()))
                if key:
                    counters.add(key)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _GROWTH:
                key = scope.key(node.func.value)
                if key:
                    lengths.add(key)
    if not counters and not lengths:
        return []
    found: list[str] = []
    for fn, _cls in funcs:
        scope = scopes[id(fn)]
        tainted: dict[str, str] = {}  # local name -> the counter it was assigned from
        for _ in range(3):  # locals assigned from a counter, and from those
            for node in _walk_own(fn):
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    hit = _reads(node.value, scope, counters, lengths, tainted)
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for n in (n for t in targets for n in ast.walk(t) if hit):
                        if isinstance(n, ast.Name) and n.id in scope.local:
                            tainted.setdefault(n.id, hit)
        for test in _tests(fn):
            hit = _reads(test, scope, counters, lengths, tainted)
            if hit:
                label = f"call_count:{hit}"
                if label not in found:
                    found.append(label)
    return found


def _from_input(node: ast.AST, inputs: set[str]) -> str | None:
    """The name in ``inputs`` whose tensor (or a copy or view of it) ``node`` is, if any."""
    while True:
        if isinstance(node, ast.Name):
            return node.id if node.id in inputs else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SAME_DATA:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in _SAME_DATA:
            node = node.value
        elif isinstance(node, (ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hits = [h for e in node.elts if (h := _from_input(e, inputs))]
            return hits[0] if hits else None
        elif isinstance(node, ast.Dict):
            hits = [h for e in [*node.keys, *node.values] if e is not None and (h := _from_input(e, inputs))]
            return hits[0] if hits else None
        else:
            return None


def _input_checks(tree: ast.Module) -> list[str]:
    """``input_identity:`` / ``input_kept:`` findings in ``forward`` methods (see the module docstring)."""
    module_names = _module_names(tree)
    found: list[str] = []

    def add(item: str) -> None:
        if item not in found:
            found.append(item)

    for fn, cls in _functions(tree):
        if fn.name != "forward":
            continue
        scope = _Scope(fn, cls, module_names)
        inputs = set(_params(fn)[1 if cls else 0:])

        for node in _walk_own(fn):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else \
                    (node.func.attr if isinstance(node.func, ast.Attribute) else "")
                if name in ("id", "hash", "ref", "proxy", "WeakValueDictionary", "WeakKeyDictionary") \
                        and any(_from_input(a, inputs) for a in node.args):
                    add(f"input_identity:{name}")
                if isinstance(node.func, ast.Attribute) and node.func.attr in _GROWTH | {"setdefault", "update"} \
                        and scope.key(node.func.value) and any(_from_input(a, inputs) for a in node.args):
                    add(f"input_kept:{scope.key(node.func.value)}")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        key = scope.key(sub) if isinstance(sub, (ast.Attribute, ast.Subscript)) else None
                        if key and isinstance(sub.ctx, ast.Store) and _from_input(node.value, inputs):
                            add(f"input_kept:{key}")
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(_from_input(s, inputs) for s in sides) and any(scope.key(s) for s in sides):
                    add("input_identity:is")
    return found


def timing_tampers(source: str, filename: str = "model_new.py") -> list[str]:
    """Timing tampers in ``source`` (``model_new.py``), each as ``"<kind>:<what>"`` (``patch:time.perf_counter``,
    ``wrap:torch.cuda.synchronize``, ``subclass:torch.cuda.Event``, ``seed:torch.initial_seed``,
    ``call_count:self.calls``, ``input_identity:id``, ``input_kept:self.last``), de-duplicated, in walk
    order; the grader labels them ``timing:``. A source that does not parse gives no finding (it fails to
    import, a ``load_error``)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    aliases = _aliases(tree)
    found: list[str] = []

    def add(item: str) -> None:
        if item not in found:
            found.append(item)

    def patched(target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                patched(t)
            return
        if isinstance(target, ast.Starred):
            patched(target.value)
            return
        if not isinstance(target, ast.Attribute):
            return
        dotted = dotted_name(target, aliases)
        root = _root(target)
        if dotted and timing_target(dotted):
            add(f"patch:{dotted}")
        elif target.attr in TIMING_ATTRS and not (isinstance(root, ast.Name) and root.id == "self"):
            add(f"patch:{dotted or '<object>.' + target.attr}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                patched(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            patched(node.target)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                patched(t)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr)):
            targets = [node.target] if isinstance(node, (ast.For, ast.AsyncFor, ast.NamedExpr)) else \
                [i.optional_vars for i in node.items if i.optional_vars is not None]
            for t in targets:
                patched(t)
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                dotted = dotted_name(base, aliases)
                if dotted and timing_target(dotted):
                    add(f"subclass:{dotted}")
        elif isinstance(node, ast.Call):
            func = dotted_name(node.func, aliases) or ""
            args = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                owner = dotted_name(node.args[0], aliases)
                name = node.args[1].value
                root = _root(node.args[0])
                if owner and timing_target(f"{owner}.{name}"):
                    add(f"patch:{owner}.{name}")
                elif name in TIMING_ATTRS and not (isinstance(root, ast.Name) and root.id == "self"):
                    add(f"patch:{owner or '<object>'}.{name}")
            elif func.startswith("functools."):
                for a in args:
                    dotted = dotted_name(a, aliases) if isinstance(a, (ast.Name, ast.Attribute)) else None
                    if dotted and timing_target(dotted):
                        add(f"wrap:{dotted}")
            elif func.startswith(("unittest.mock.", "mock.")):
                # patch("time.perf_counter", ...), patch.object(time, "perf_counter", ...), patch.dict(...)
                strings = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                owner = dotted_name(node.args[0], aliases) if node.args else None
                for name in strings:
                    for dotted in (name, f"{owner}.{name}" if owner else ""):
                        if dotted and timing_target(dotted):
                            add(f"patch:{dotted}")
                if owner and timing_target(owner) and not strings:
                    add(f"patch:{owner}")
            if func in SEED_CALLS:
                add(f"seed:{func}")
        elif isinstance(node, ast.Attribute) and node.attr in SEED_ATTRS:
            root = _root(node)
            if not (isinstance(root, ast.Name) and root.id == "self"):
                add(f"seed:{dotted_name(node, aliases) or '<object>.' + node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if a.name in SEED_ATTRS or full in SEED_CALLS:
                    add(f"seed:{full}")
    for item in _call_counters(tree, aliases) + _input_checks(tree):
        add(item)
    return found


# -- run time, in the candidate's process ------------------------------------------------------------------

_TIME = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
         "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns", "sleep",
         "get_clock_info")
_STATISTICS = ("median", "median_low", "median_high", "median_grouped", "mean", "fmean", "geometric_mean",
               "harmonic_mean", "quantiles", "stdev", "pstdev", "variance", "pvariance", "mode")
_NUMPY = ("median", "mean", "percentile", "quantile", "nanmedian", "nanmean", "nanpercentile", "nanquantile",
          "average", "std", "var", "sort", "min", "max")
_SYNC = ("synchronize", "current_stream", "default_stream", "stream", "Event", "Stream", "ExternalStream",
         "StreamContext", "set_stream", "elapsed_time", "graph", "CUDAGraph")
_EVENT = ("record", "wait", "query", "elapsed_time", "synchronize", "__init__", "__new__")
_STREAM = ("synchronize", "wait_event", "wait_stream", "record_event", "query", "__init__", "__new__")
_GRAPH = ("replay", "capture_begin", "capture_end", "__init__", "__new__")


def runtime_targets() -> list[tuple[str, Any, tuple[str, ...]]]:
    """(label, owner, attribute names) of the functions whose identity the candidate's process watches: the clocks of ``time``, the statistics of ``statistics``, ``numpy`` (when
    loaded) and ``torch`` / ``torch.Tensor``, the synchronisation and stream functions of ``torch.cuda``,
    ``torch.accelerator`` and ``torch.cpu``, the methods of the CUDA and generic event and stream classes, and
    those of ``torch.cuda.CUDAGraph`` (the grader's replays). Owners that this torch lacks are left out."""
    import statistics
    import sys
    import time

    import torch

    out: list[tuple[str, Any, tuple[str, ...]]] = [("time", time, _TIME), ("statistics", statistics, _STATISTICS),
                                                   ("torch", torch, STAT_NAMES + ("Event", "Stream")),
                                                   ("torch.Tensor", torch.Tensor, STAT_NAMES),
                                                   ("torch.cuda", torch.cuda, _SYNC)]
    if "numpy" in sys.modules:
        out.append(("numpy", sys.modules["numpy"], _NUMPY))
    for label in ("torch.accelerator", "torch.cpu"):
        mod = getattr(torch, label.split(".")[1], None)
        if mod is not None:
            out.append((label, mod, _SYNC))
    for label, cls, names in (("torch.cuda.Event", getattr(torch.cuda, "Event", None), _EVENT),
                              ("torch.cuda.Stream", getattr(torch.cuda, "Stream", None), _STREAM),
                              ("torch.Event", getattr(torch, "Event", None), _EVENT),
                              ("torch.Stream", getattr(torch, "Stream", None), _STREAM),
                              ("torch.cuda.CUDAGraph", getattr(torch.cuda, "CUDAGraph", None), _GRAPH)):
        if cls is not None:
            out.append((label, cls, names))
    return out


_MISSING = object()


class TimingSnapshot:
    """The watched functions (``runtime_targets``) as they were when it was made: per owner, the names
    present then and their objects. ``changes()`` compares identities with one C-level ``attrgetter`` and
    ``operator.is_`` pass per owner (a few microseconds for all of them)."""

    def __init__(self) -> None:
        import operator

        self._is = operator.is_
        self.owners: list[tuple[str, Any, tuple[str, ...], Any, tuple[Any, ...]]] = []
        for label, owner, names in runtime_targets():
            present = tuple(n for n in names if getattr(owner, n, _MISSING) is not _MISSING)
            if present:
                get = operator.attrgetter(*present)
                objs = get(owner)
                self.owners.append((label, owner, present, get, objs if len(present) > 1 else (objs,)))

    def changes(self) -> list[str]:
        """``"<owner>.<name>"`` of each watched function that is no longer the object it was (replaced,
        wrapped or deleted), in a fixed order."""
        out: list[str] = []
        for label, owner, names, get, objs in self.owners:
            try:
                now = get(owner)
                if all(map(self._is, now if len(names) > 1 else (now,), objs)):
                    continue
            except AttributeError:  # one was deleted
                pass
            out += [f"{label}.{n}" for n, o in zip(names, objs, strict=True) if getattr(owner, n, _MISSING) is not o]
        return out
