"""Value magnitudes of a composed graph: a rough root-mean-square of each tensor, so that an op with a narrow
working range (sigmoid, tanh, softmax, exp, special functions) is drawn only where its input lies in that range.

Trained networks keep activations near unit scale: weights are initialised by fan-in (``nn.Linear`` /
``nn.Conv*``: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)); functional weights of composed tasks are drawn
``randn / sqrt(fan_in)``, ``compose.graphs.render``) and normalisation layers reset the scale. A sum over n values, a
cumulative sum over n steps, an exponential or a product grows it; a sigmoid or tanh after such an op saturates
to 0 / 1 (or -1 / 1), a softmax becomes one-hot, an exponential overflows. ``out_rms`` propagates an estimate
(the RMS of N(0, 1) inputs is 1) through the op kinds that change it; other ops keep the largest input RMS.
``saturates(name, rms)`` says whether an op's input is past its working range (``WORKING_RMS``).

The rules are order-of-magnitude estimates for independent zero-mean values (a sum of n grows by sqrt(n), the
maximum of n normals is about sqrt(2 ln n) standard deviations); the composer's test checks real draws.
"""

from __future__ import annotations

import math
import re

# Input RMS per value kind of ``seeds.seed_op.TensorSpec`` (normal: N(0, 1); unit: U(0, 1); positive: U(0.1,
# 1.1)); index and bool tensors do not enter float arithmetic by value here.
INPUT_RMS = {"normal": 1.0, "unit": 0.58, "positive": 0.69, "bool": 0.71}
WORKING_RMS = 3.0  # input RMS above which a saturating op's output is mostly at its bounds
WILD = 1e6  # a magnitude no estimate holds (products, reciprocals, random exponents)

SATURATING = re.compile(
    r"^(sigmoid|tanh|softmax|log_softmax|softmin|softmax2d|hardsigmoid|hardtanh|softsign|erf|erfc|erfinv|exp|"
    r"exp2|expm1|cosh|sinh|tan|i0|i0e|i1|i1e|logit|special_\w+|atan|arctan|asin|arcsin|acos|arccos|atanh|"
    r"arctanh|digamma|lgamma|polygamma|mvlgamma|sinc|glu)$")
# Ops whose own output is bounded by about 1 whatever the input (normalisations reset the scale).
_UNIT_OUT = re.compile(
    r"^(sigmoid|tanh|softmax|softmin|softmax2d|hardsigmoid|hardtanh|softsign|erf|erfc|sin|cos|normalize|"
    r"cosine_similarity|layer_norm|native_layer_norm|rms_norm|(sync_)?batch_norm([123]d)?|group_norm|"
    r"instance_norm([123]d)?|local_response_norm|cross_map_lrn2d|lstm|gru|rnn|(lstm|gru|rnn)_cell|sign|sgn|"
    r"relu6|clamp|clip|atan|arctan|tanhshrink|logit)$")
_SUM = re.compile(r"^(sum|nansum|cumsum|cumulative_trapezoid|trapz|trapezoid)$")
_EXTREME = re.compile(r"^(amax|amin|max|min|aminmax|cummax|cummin|logsumexp|logcumsumexp|topk|kthvalue|norm|"
                      r"std|var|dist|pairwise_distance|cdist)$")
_GROW_EXP = re.compile(r"^(exp|exp2|expm1|cosh|sinh)$")
_WILD = re.compile(r"^(prod|cumprod|pow|float_power|reciprocal|rsqrt|tan|ldexp|xlogy|polygamma|i0|i1|logit|"
                   r"erfinv|frexp|fmod|remainder)$")
_DIV = re.compile(r"^(div|true_divide|divide)$")
# RMS of 1 / U(0.1, 1.1), the ``positive`` divisor: sqrt(1 / 0.1 - 1 / 1.1)
_POSITIVE_RECIPROCAL_RMS = 3.02


def saturates(name: str, rms: float) -> bool:
    """Whether op ``name`` has a narrow working range and its input's RMS ``rms`` is past it."""
    return bool(SATURATING.match(name)) and rms > WORKING_RMS


def out_rms(name: str, rms: list[float], in_numel: int, out_numel: int, reduced: int = 1) -> float:
    """Estimated RMS of op ``name``'s output from its tensor inputs' ``rms`` (primary first).

    ``in_numel`` / ``out_numel``: element counts of the primary input and the output; ``reduced``: number of
    values combined per output value along a scanned or reduced axis (cumulative sums)."""
    if not rms:
        return 1.0
    s = rms[0]
    n = max(reduced, in_numel // max(out_numel, 1), 1)
    if name in ("add", "sub", "subtract", "addmm", "baddbmm", "lerp", "addcmul", "addcdiv", "hypot",
                "logaddexp", "logaddexp2"):
        return min(math.sqrt(sum(r * r for r in rms)), WILD)
    if name in ("mul", "multiply"):
        return min(math.prod(rms), WILD)
    if _UNIT_OUT.match(name):
        return 1.0
    if _SUM.match(name):
        return min(s * math.sqrt(n), WILD)
    if _EXTREME.match(name):
        return min(s * (1.0 + math.sqrt(2.0 * math.log(n))) + (math.log(n) if "logsumexp" in name or
                                                                 "logcumsumexp" in name else 0.0), WILD)
    if _GROW_EXP.match(name):
        return min(math.exp(min(s * s, 50.0)), WILD)
    if name in ("square",):
        return min(s * s * math.sqrt(3.0), WILD)
    if _DIV.match(name):
        positive = len(rms) > 1 and rms[1] == INPUT_RMS["positive"]
        return min(s * _POSITIVE_RECIPROCAL_RMS, WILD) if positive else WILD
    if _WILD.match(name):
        return WILD
    return max(rms)
