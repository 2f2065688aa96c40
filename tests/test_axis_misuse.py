"""``task.axis_misuse``: axis-wise ops over the batch axis and flattened rolls are flagged, correct uses pass."""

import pytest
from opforge.task.axis_misuse import axis_misuse

TEMPLATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{body}


batch_size = 16
seq_len = 32
features = 64


def get_inputs():
    return [torch.randn(batch_size, seq_len, features)]


def get_init_inputs():
    return []
'''


def task(body: str, init: str = "pass") -> str:
    ind = "        "
    return TEMPLATE.format(body="\n".join(ind + line for line in body.splitlines()),
                           init="\n".join(ind + line for line in init.splitlines()))


MISUSES = {
    "softmax": "return torch.softmax(x, dim=0)",
    "log_softmax_method": "return x.log_softmax(0)",
    "softmax_implicit_3d": "return F.softmax(x)",
    "cumsum": "return torch.cumsum(x, 0)",
    "logcumsumexp": "return torch.logcumsumexp(x, dim=-3)",
    "sort": "return torch.sort(x, dim=0)[0]",
    "argsort": "return x.argsort(dim=0).float()",
    "topk": "return torch.topk(x, 2, dim=0).values",
    "argmax": "return torch.argmax(x, dim=0).float()",
    "argmax_flat": "return torch.argmax(x).float()",
    "max_dim": "return torch.max(x, 0)[0]",
    "min_dim_kw": "return x.min(dim=0).values",
    "chunk_default": "a, b = x.chunk(2)\nreturn a * b",
    "split": "a, b = torch.split(x, 8)\nreturn a + b",
    "gradient_all": "return torch.gradient(x)[1]",
    "roll_flat": "return torch.roll(x, 3)",
    "roll_batch": "return torch.roll(x, 1, dims=0)",
    "after_flatten": "y = x.reshape(-1, x.shape[-1])\nreturn torch.softmax(y, dim=0)",
    "after_transpose": "y = x.transpose(0, 2)\nreturn torch.cumsum(y, dim=2)",
}
CORRECT = {
    "softmax": "return torch.softmax(x, dim=-1)",
    "log_softmax_seq": "return F.log_softmax(x, dim=1)",
    "cumsum_seq": "return torch.cumsum(x, dim=1)",
    "sort_features": "return torch.sort(x)[0]",
    "topk": "return torch.topk(x, 4).values",
    "argmax": "return x.argmax(dim=-1).float()",
    "max_full": "return torch.max(x) + x",
    "max_pair": "return torch.max(x, torch.zeros_like(x))",
    "chunk_features": "a, b = x.chunk(2, dim=-1)\nreturn a * torch.sigmoid(b)",
    "gradient_seq": "return torch.gradient(x, dim=1)[0]",
    "roll_dims": "return torch.roll(x, shifts=1, dims=1)",
    "after_transpose": "y = x.transpose(1, 2)\nreturn torch.cumsum(y, dim=2)",
    "flattened_rows_keep_batch": "y = x.reshape(x.shape[0], -1)\nreturn torch.softmax(y, dim=1)",
}


@pytest.mark.parametrize("name", sorted(MISUSES))
def test_flags_misuse(name):
    check = axis_misuse(task(MISUSES[name]), name)
    assert check.misused is True, (name, check.reasons)
    assert check and check.reason


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_passes_correct_use(name):
    check = axis_misuse(task(CORRECT[name]), name)
    assert check.misused is False, (name, check.reasons)
    assert not check


def test_module_softmax_without_dim_on_3d_input_is_over_the_batch():
    assert axis_misuse(task("return self.sm(x)", "self.sm = nn.Softmax()"))
    assert not axis_misuse(task("return self.sm(x)", "self.sm = nn.Softmax(dim=-1)"))


def test_code_reading_the_batch_constant_still_traces():
    check = axis_misuse(task("y = x.view(batch_size, -1)\nreturn torch.cumsum(y, dim=0)"))
    assert check.misused is True, check.reasons
    assert axis_misuse(task("y = x.view(batch_size, -1)\nreturn torch.cumsum(y, dim=1)")).misused is False


def test_untraceable_task_is_none_with_a_reason():
    check = axis_misuse(task("return x[x > 0].sum() + torch.nonzero(x).float().sum()"))
    assert check.misused is None and not check and "untraced" in check.reason
    assert axis_misuse("not python (").misused is None
