"""``static`` filter: the source parses, defines the KernelBench names, and ``forward`` uses no RNG."""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

from opforge.filters.verdict import Cost, Filter, TaskInput, Verdict
from opforge.task.source import TaskFormatError, check_source

# Calls that draw from the RNG. Names are matched on the last attribute of the call
# (``torch.randn_like``, ``x.normal_()``, ``F.dropout``...).
RNG_CALLS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "random_", "poisson", "rrelu", "rrelu_", "dropout", "dropout1d", "dropout2d",
    "dropout3d", "alpha_dropout", "feature_alpha_dropout", "gumbel_softmax", "fractional_max_pool2d",
    "fractional_max_pool3d", "empty", "empty_like", "empty_strided",
    # re-seeding inside forward hides a random draw behind a fixed seed
    "manual_seed", "seed",
})
# Random only when ``training`` is true: the torch.nn.functional functions with a ``training`` parameter.
_TRAINING_GATED = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                   "rrelu")


@functools.cache
def _training_param(name: str) -> tuple[int, bool]:
    """(position, default) of ``training`` in ``torch.nn.functional.<name>``, read from the installed torch
    (``dropout`` defaults to True, ``alpha_dropout`` and ``rrelu`` to False)."""
    import torch.nn.functional as F

    params = list(inspect.signature(getattr(F, name)).parameters.values())
    pos = next(i for i, p in enumerate(params) if p.name == "training")
    return pos, bool(params[pos].default)


def _is_training(node: ast.Call, name: str) -> bool:
    """Whether a call of a training-gated function draws random numbers: its ``training`` argument
    (keyword or positional) unless that is the constant False, else the function's default."""
    pos, training = _training_param(name)
    given = [k.value for k in node.keywords if k.arg == "training"] or node.args[pos:pos + 1]
    if given:
        training = not (isinstance(given[0], ast.Constant) and given[0].value is False)
    return training


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def rng_calls_in_forward(tree: ast.Module) -> list[str]:
    """Names of RNG calls inside ``Model.forward`` (and any other method ``forward`` calls on ``self``)."""
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return []
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    todo, seen, found = ["forward"], set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if not isinstance(node, ast.Call):
                continue
            cname = _call_name(node)
            on_self = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "self"
            if on_self:
                # a method is followed; a submodule (``self.dropout(x)``) is judged at run time in eval()
                if cname in methods:
                    todo.append(cname)
                continue
            if cname in RNG_CALLS:
                if cname in _TRAINING_GATED and not _is_training(node, cname):
                    continue
                found.append(cname)
    return found


class StaticFilter(Filter):
    """Rejects ``invalid_task`` (no parse / missing ``Model``, ``get_inputs``, ``get_init_inputs``) and
    ``stochastic`` (an RNG call in ``forward``). Execution-time randomness is caught by the execution filter."""

    name = "static"
    cost = Cost.STATIC

    def score(self, task: TaskInput) -> dict[str, Any]:
        try:
            tree = check_source(task.code, task.task_id)
        except TaskFormatError as exc:
            return {"valid": False, "error": str(exc), "rng_calls": []}
        return {"valid": True, "error": None, "rng_calls": rng_calls_in_forward(tree)}

    def decide(self, metrics: dict[str, Any]) -> Verdict:
        if not metrics["valid"]:
            return self.reject("invalid_task", metrics)
        if metrics["rng_calls"]:
            return self.reject(f"stochastic:{metrics['rng_calls'][0]}", metrics)
        return self.accept(metrics)
