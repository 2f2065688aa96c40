import pandas as pd
import pytest
from opforge.filters.static import StaticFilter
from opforge.filters.verdict import Verdict

from .paths import OPS6K, needs_shared

GOOD = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
    def forward(self, x):
        return torch.relu(self.lin(x))

def get_inputs():
    return [torch.randn(2, 8)]

def get_init_inputs():
    return []
"""


def _with_forward(body: str) -> str:
    return GOOD.replace("        return torch.relu(self.lin(x))", body)


def test_positive_control_passes():
    v = StaticFilter()(GOOD)
    assert v.accepted and v.reason is None and v.metrics["rng_calls"] == []


@pytest.mark.parametrize("body, name", [
    ("        return x + torch.randn_like(x)", "randn_like"),
    ("        return torch.nn.functional.dropout(x, p=0.5, training=True)", "dropout"),
    ("        return x * torch.bernoulli(torch.sigmoid(x))", "bernoulli"),
    ("        return x.normal_()", "normal_"),
    ("        return self.helper(x)\n    def helper(self, x):\n        return x * torch.rand(1)", "rand"),
])
def test_rng_in_forward_is_stochastic(body, name):
    v = StaticFilter()(_with_forward(body))
    assert not v.accepted and v.reason == f"stochastic:{name}"


def test_rrelu_is_random_only_when_training():
    assert StaticFilter()(_with_forward("        return torch.nn.functional.rrelu(x)")).accepted
    v = StaticFilter()(_with_forward("        return torch.nn.functional.rrelu(x, training=True)"))
    assert v.reason == "stochastic:rrelu"


def test_dropout_in_eval_form_is_allowed():
    v = StaticFilter()(_with_forward("        return torch.nn.functional.dropout(x, p=0.5, training=False)"))
    assert v.accepted
    assert StaticFilter()(_with_forward("        return torch.nn.functional.dropout(x, 0.5, False)")).accepted
    assert not StaticFilter()(_with_forward("        return torch.nn.functional.dropout(x, 0.5)")).accepted


def test_alpha_dropout_follows_torchs_training_default():
    # torch.nn.functional.alpha_dropout / feature_alpha_dropout default to training=False, unlike dropout
    for name in ("alpha_dropout", "feature_alpha_dropout"):
        assert StaticFilter()(_with_forward(f"        return torch.nn.functional.{name}(x)")).accepted
        v = StaticFilter()(_with_forward(f"        return torch.nn.functional.{name}(x, 0.5, True)"))
        assert v.reason == f"stochastic:{name}"


@pytest.mark.parametrize("code", ["def broken(:\n", GOOD.replace("def get_inputs", "def other_inputs"), ""])
def test_invalid_task(code):
    v = StaticFilter()(code, "t1")
    assert not v.accepted and v.reason == "invalid_task"


def test_verdict_rejects_unknown_reason():
    with pytest.raises(ValueError, match="unknown reason"):
        Verdict(False, "x", "because")


@needs_shared
def test_ops6k_rows_with_random_forward_are_caught():
    df = pd.read_parquet(OPS6K)
    f = StaticFilter()
    flagged = [i for i, c in enumerate(df.code) if (v := f(c, str(i))).reason and v.reason.startswith("stochastic")]
    # docs/DESIGN.md §6: about 9 rows call random functions inside forward
    assert 5 <= len(flagged) <= 60
    assert all("rand" in df.code[i] or "dropout" in df.code[i] or "bernoulli" in df.code[i]
               or "normal" in df.code[i] or "empty" in df.code[i] or "multinomial" in df.code[i]
               or "rrelu" in df.code[i] or "gumbel" in df.code[i] or "fractional" in df.code[i] for i in flagged)
