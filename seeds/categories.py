"""Coarse op categories, assigned from the op's name (first matching rule wins)."""

from __future__ import annotations

import re

CATEGORIES = (
    "attention", "recurrent", "conv", "pooling", "normalization", "gemm", "embedding", "loss",
    "resampling", "padding", "scan", "reduction", "shape", "activation", "elementwise", "comparison",
    "block", "other",
)

_RULES: list[tuple[str, str]] = [
    ("attention", r"attention|attn|multihead|multi_head"),
    ("recurrent", r"^(rnn|lstm|gru)|rnn_|lstm|gru"),
    ("loss", r"loss|_entropy|kl_div|nll"),
    ("conv", r"conv|unfold|fold$|im2col|col2im"),
    ("pooling", r"pool"),
    ("normalization", r"norm|lrn|local_response|normalize|whiten"),
    ("gemm", r"^linear|bilinear|matmul|^mm$|^bmm|addmm|addbmm|baddbmm|addmv|^mv$|einsum|^outer|^inner|"
             r"^dot|tensordot|chain_matmul|kron|^ger$|^vdot|cdist|pdist|lazylinear"),
    ("embedding", r"embedding|one_hot"),
    ("resampling", r"upsampl|interpolate|pixel_(un)?shuffle|grid_sample|affine_grid|channel_shuffle"),
    ("padding", r"pad"),
    ("scan", r"^cum|logcumsumexp"),
    ("reduction", r"^(sum|mean|prod|std|var|amax|amin|max|min|argmax|argmin|norm|logsumexp|median|"
                  r"nanmedian|nansum|nanmean|mode|all|any|count_nonzero|std_mean|var_mean|aminmax|"
                  r"topk|kthvalue|sort|argsort|msort|softmax|log_softmax|softmin|quantile|nanquantile|"
                  r"dist|histc|trace)$"),
    ("shape", r"reshape|view|permute|transpose|flatten|squeeze|unsqueeze|^cat$|concat|stack|split|chunk|"
              r"flip|roll|rot90|narrow|select|gather|scatter|index|take|tril|triu|diag|repeat|tile|"
              r"expand|movedim|moveaxis|swap|^t$|unbind|masked|where|clone|contiguous|identity|"
              r"channel|pixel|meshgrid|broadcast|ravel|vsplit|hsplit|dsplit|unflatten"),
    ("comparison", r"^(eq|ne|gt|ge|lt|le|greater|less|equal|not_equal|isclose|isnan|isinf|isfinite|"
                   r"isneginf|isposinf|isreal|signbit|maximum|minimum|fmax|fmin|logical_\w+|bitwise_\w+|"
                   r"isin|bucketize|searchsorted)"),
    ("activation", r"relu|gelu|elu|selu|silu|swish|mish|sigmoid|tanh|softplus|softsign|softshrink|"
                   r"hardshrink|tanhshrink|threshold|hardtanh|hardswish|hardsigmoid|glu|prelu|logsigmoid|"
                   r"activation|quickgelu|sinusoidal"),
]


def categorize(name: str, same_shape: bool = False) -> str:
    """Category for an op called ``name`` (``Conv2d``, ``gelu``, ``cumsum``, ``LlamaMLP``).

    ``same_shape``: the op's output shape equals its input's (falls back to ``elementwise``).
    """
    n = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    for cat, pat in _RULES:
        if re.search(pat, n):
            return cat
    return "elementwise" if same_shape else "other"
