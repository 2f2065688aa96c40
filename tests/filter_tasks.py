"""Small KernelBench-format tasks written for the filter tests: one good task and one bad task per reason."""

from __future__ import annotations


def task(forward: str, init: str = "", extra_imports: str = "", inputs: str = "[torch.randn(16, 32)]",
         init_inputs: str = "[32]") -> str:
    """A task whose ``Model(n)`` holds a Linear(n, n) as ``self.lin``, with the given forward body."""
    return f'''import torch
import torch.nn as nn
{extra_imports}

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
{init}

    def forward(self, x):
{forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_inputs}
'''


GOOD = task("        return torch.relu(self.lin(x)) * 2.0")

BAD = {
    # reason prefix -> task
    "eager_error": task("        return self.lin(x.view(-1, 7))"),
    "eager_error:unregistered_tensor": task("        return self.lin(x) * self.scale",
                                            init="        self.scale = torch.full((32,), 2.0)"),
    "non_finite": task("        return torch.log(self.lin(x) - 100.0)"),
    "stochastic": task('        noise = getattr(torch, "randn" + "_like")(x)\n        return self.lin(x) + noise'),
    "nondeterministic:reseed": task("        self.calls += 1\n        return self.lin(x) * self.calls",
                                    init="        self.calls = 0"),
    # the constructor reads process state that torch.manual_seed does not reset (here a build counter;
    # Python's ``random`` is the common case, but two draws can land within the drift bound by chance)
    "nondeterministic:rebuild": task("        return self.lin(x) * self.scale",
                                     init="        type(self).builds = getattr(type(self), 'builds', 0) + 1\n"
                                          "        self.scale = 0.5 * type(self).builds"),
    "degenerate_output:all_zeros": task("        return self.lin(x) * 1e-5"),
    "degenerate_output:constant": task("        return torch.ones_like(self.lin(x)) * 3.0 + 0.0 * x.sum()"),
    "degenerate_output:input_independent": task(
        "        return torch.arange(x.numel(), dtype=x.dtype).reshape(x.shape) + 0.0 * x"),
    "compile_mismatch": task("        if torch.compiler.is_compiling():\n            return self.lin(x) * 3.0\n"
                             "        return self.lin(x)"),
    "compile_error": task("        if torch.compiler.is_compiling():\n            return x.view(-1, 7)\n"
                          "        return self.lin(x)"),
}

# a tuple output where only one member is trivial is still a real task
TUPLE_WITH_ZERO_MEMBER = task("        y = self.lin(x)\n        return y, torch.zeros_like(y)")
