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

# Tasks the ``trivial`` filter rejects, by reason: name -> (reason, source, op labels the metrics must name).
_BN_INIT = "        self.bn = nn.BatchNorm1d(32)"
TRIVIAL = {
    "tile_by_ones": ("trivial:noop", task("        return torch.softmax(torch.tile(self.lin(x), dims=[1]), dim=-1)"),
                     ["torch.tile"]),
    "relu_after_relu": ("trivial:noop", task("        return torch.relu(torch.relu(self.lin(x))) * 2.0"),
                        ["torch.relu"]),
    "abs_after_relu": ("trivial:noop", task("        return torch.abs(torch.nn.functional.relu(self.lin(x))) - 0.5"),
                       ["torch.abs"]),
    "pad_by_zero": ("trivial:noop", task("        return torch.nn.functional.pad(torch.tanh(self.lin(x)), (0, 0, 0, 0))"),
                    ["F.pad"]),
    "clamp_after_sigmoid": ("trivial:noop", task("        return torch.clamp(torch.sigmoid(self.lin(x)), 0.0, 1.0) * x"),
                            ["torch.clamp"]),
    "transposes_cancel": ("trivial:noop", task("        y = self.lin(x).transpose(0, 1)\n"
                                               "        return torch.tanh(y.transpose(0, 1))"),
                          ["Tensor.transpose", "Tensor.transpose"]),
    "permute_inverse": ("trivial:noop", task("        y = self.lin(x).unsqueeze(0).permute(2, 0, 1)\n"
                                             "        return torch.tanh(y.permute(1, 2, 0).squeeze(0))"),
                        ["Tensor.permute", "Tensor.permute"]),
    "reshape_and_back": ("trivial:noop", task("        y = self.lin(x).reshape(4, 128)\n"
                                              "        return torch.tanh(y.view(16, 32))"),
                         ["Tensor.reshape", "Tensor.view"]),
    "batchnorm_default_stats": ("trivial:noop", task("        return torch.tanh(self.bn(self.lin(x)))", init=_BN_INIT),
                                ["BatchNorm1d"]),
    "topk_then_zeros_like": ("trivial:noop", task("        y = self.lin(x)\n"
                                                  "        z = torch.zeros_like(torch.topk(y, 4, dim=1).values)\n"
                                                  "        return torch.tanh(y) * 2.0 + z.sum()"),
                             ["torch.topk"]),
    "returns_its_input": ("trivial:identity", task("        return torch.maximum(x, self.lin(x) - 100.0)"), []),
}

# Tasks where every op matters: the ``trivial`` filter accepts them.
_TRAINED_BN = ("        self.bn = nn.BatchNorm1d(32)\n        g = torch.Generator().manual_seed(5)\n"
               "        with torch.no_grad():\n"
               "            self.bn.running_mean.copy_(torch.randn(32, generator=g))\n"
               "            self.bn.running_var.copy_(torch.rand(32, generator=g) + 0.5)\n"
               "            self.bn.weight.copy_(torch.randn(32, generator=g))\n"
               "            self.bn.bias.copy_(torch.randn(32, generator=g))")
BF16_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n, dtype=torch.bfloat16)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.lin(x))
        return RELU(y * 1.5 + x)


def get_inputs():
    return [torch.randn(16, 32, dtype=torch.bfloat16)]


def get_init_inputs():
    return [32]
'''
NONTRIVIAL = {
    "three_op_chain": task("        return torch.softmax(self.lin(x), dim=-1) * 3.0"),
    "residual_dag": task("        y = self.lin(x)\n        return torch.relu(y) + x * torch.sigmoid(y)"),
    "batchnorm_trained_stats": task("        return torch.tanh(self.bn(self.lin(x)))", init=_TRAINED_BN),
    "transpose_that_stays": task("        return torch.tanh(self.lin(x).transpose(0, 1)) @ x"),
    "bf16": BF16_TASK.replace("RELU", "torch.tanh"),
}
# bf16 with a no-op: relu over the gelu-based sum is not one, so a relu after relu is added
BF16_NOOP = BF16_TASK.replace("RELU(y * 1.5 + x)", "torch.relu(torch.relu(y * 1.5 + x))")

# relu is a no-op on the first input draw only (all inputs positive for INPUT_SEED, negative for
# ALT_INPUT_SEED): one draw's coincidence must not reject
RELU_NOOP_ON_ONE_DRAW = task("        return self.lin(torch.relu(x))",
                             inputs="[(lambda s: torch.rand(16, 32) * (1.0 if s > 0.5 else -1.0))(torch.rand(1).item())]")
# data-dependent control flow: torch.fx cannot trace it
UNTRACEABLE = task("        y = self.lin(x)\n        if y.sum() > 0:\n            return torch.relu(torch.relu(y))\n"
                   "        return torch.relu(torch.relu(-y))")
# an in-place op after one that ablation bypasses: the inputs must come out unchanged
INPLACE = task("        return torch.exp(x).add_(1.0) * self.lin(x)")
