"""``static`` filter: the source parses, defines the KernelBench names, and ``forward`` uses no RNG."""

from __future__ import annotations

import ast
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
# Random only when training; value = the function's default for ``training`` (torch.nn.functional:
# dropout* default to True, rrelu to False).
_TRAINING_GATED = {"dropout": True, "dropout1d": True, "dropout2d": True, "dropout3d": True,
                   "alpha_dropout": True, "feature_alpha_dropout": True, "rrelu": False}


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
                if cname in _TRAINING_GATED:
                    training = _TRAINING_GATED[cname]
                    for k in node.keywords:
                        if k.arg == "training":
                            training = not (isinstance(k.value, ast.Constant) and k.value.value is False)
                    if not training:
                        continue
                found.append(cname)
    return found


class StaticFilter(Filter):
    """Rejects ``invalid_task`` (no parse / missing ``Model``, ``get_inputs``, ``get_init_inputs``) and
    ``stochastic`` (an RNG call in ``forward``). Execution-time randomness is caught by the execution filter."""

    name = "static"
    cost = Cost.STATIC
    order = 0

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
