"""Coarse op categories, assigned from the op's name (first matching rule wins)."""

from __future__ import annotations

import re

CATEGORIES = (
    "attention", "recurrent", "conv", "pooling", "normalization", "gemm", "linalg", "embedding", "loss",
    "resampling", "padding", "scan", "reduction", "shape", "activation", "elementwise", "comparison",
    "block", "other",
)

_RULES: list[tuple[str, str]] = [
    ("block", r"^transformer|encoder_layer|decoder_layer"),
    ("attention", r"attention|attn|multihead|multi_head"),
    ("recurrent", r"^(rnn|lstm|gru)|rnn_|lstm|gru"),
    ("loss", r"loss|_entropy|kl_div|nll"),
    ("conv", r"conv|unfold|fold$|im2col|col2im"),
    ("pooling", r"pool"),
    # matrix decompositions and solvers (LAPACK / cuSOLVER calls, not fusable elementwise work)
    ("linalg", r"svd|pinv|^qr$|^lu$|lu_factor|lu_solve|geqrf|orgqr|ormqr|householder|nuclear_norm|"
               r"matrix_norm|^det$|logdet|^inverse$|^inv$|cholesky|^eig|lstsq|matrix_rank|matrix_power|"
               r"matrix_exp|^solve|triangular_solve|^linalg"),
    # exact names first: ``norm`` is a reduction, ``softmax2d`` a softmax over channels
    ("reduction", r"^(sum|mean|prod|std|var|amax|amin|max|min|argmax|argmin|norm|logsumexp|median|"
                  r"nanmedian|nansum|nanmean|mode|all|any|count_nonzero|std_mean|var_mean|aminmax|"
                  r"topk|kthvalue|sort|argsort|msort|softmax|softmax2d|log_softmax|softmin|quantile|"
                  r"nanquantile|dist|histc|trace)$"),
    ("normalization", r"norm|lrn|local_response|normalize|whiten"),
    ("gemm", r"^linear|bilinear|matmul|^mm$|^bmm|addmm|addbmm|baddbmm|addmv|^mv$|einsum|^outer|^inner|"
             r"^dot|tensordot|chain_matmul|kron|^ger$|^vdot|cdist|pdist|lazylinear"),
    ("embedding", r"embedding|one_hot"),
    ("resampling", r"upsampl|interpolate|pixel_(un)?shuffle|grid_sample|affine_grid|channel_shuffle"),
    ("padding", r"pad"),
    ("scan", r"^cum|logcumsumexp"),
    ("shape", r"reshape|view|permute|transpose|flatten|squeeze|unsqueeze|^cat$|concat|stack|split|chunk|"
              r"flip|roll|rot90|narrow|select|gather|scatter|index|take|tril|triu|diag|repeat|tile|"
              r"expand|movedim|moveaxis|swap|^t$|unbind|masked|where|clone|contiguous|identity|"
              r"channel|pixel|meshgrid|broadcast|ravel|vsplit|hsplit|dsplit|unflatten"),
    # whole names only: ``gelu`` starts like ``ge``, ``leaky_relu`` does not start a comparison
    ("comparison", r"^(eq|ne|gt|ge|lt|le|greater|greater_equal|less|less_equal|equal|not_equal|isclose|"
                   r"isnan|isinf|isfinite|isneginf|isposinf|isreal|signbit|maximum|minimum|fmax|fmin|"
                   r"logical_\w+|bitwise_\w+|isin|bucketize|searchsorted)$"),
    ("activation", r"relu|gelu|elu|selu|silu|swish|mish|sigmoid|tanh|softplus|softsign|softshrink|"
                   r"hardshrink|tanhshrink|threshold|hardtanh|hardswish|hardsigmoid|glu|prelu|logsigmoid|"
                   r"activation|quickgelu|sinusoidal"),
]


def categorize(name: str, same_shape: bool = False) -> str:
    """Category for an op called ``name`` (``Conv2d``, ``gelu``, ``cumsum``, ``LlamaMLP``).

    ``same_shape``: the op's output shape equals its input's (falls back to ``elementwise``).
    """
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    # each rule sees the snake_case name and the plain lower-case one: ``ReLU`` is ``re_lu`` in snake case
    names = (snake, name.lower())
    for cat, pat in _RULES:
        if any(re.search(pat, n) for n in names):
            return cat
    return "elementwise" if same_shape else "other"
