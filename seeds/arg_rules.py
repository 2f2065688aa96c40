"""Argument-name rules: a value for each required argument of a torch op, by the argument's name.

Values may reference size symbols (``"$C"``: the input's channel / feature size, ``"$K"``: a free output
size). A required argument with no rule makes the probe skip the op (``no_rule:<arg>`` in the skip report);
curated YAML under ``seeds/specs/`` then supplies it.
"""

from __future__ import annotations

# Names under which torch passes a tensor argument.
TENSOR_ARGS = frozenset({
    "input", "x", "self", "other", "tensor", "tensor1", "tensor2", "mat", "mat1", "mat2", "vec", "vec1",
    "vec2", "batch1", "batch2", "a", "b", "A", "B", "x1", "x2", "input1", "input2", "target", "elements",
    "test_elements", "exponent", "end", "query", "key", "value", "anchor", "positive", "negative",
    "condition", "y", "input_tensor", "sorted_sequence", "boundaries", "mask", "src", "source",
})

# Tensor arguments whose shape is the primary input's (binary elementwise and losses).
SAME_SHAPE_ARGS = frozenset({
    "other", "tensor1", "tensor2", "target", "x2", "input2", "y", "exponent", "end", "positive",
    "negative", "key", "value", "b", "B", "source", "src",
})

# Constructor (module) arguments.
MODULE_ARGS: dict[str, object] = {
    "in_features": "$C", "out_features": "$K", "in_channels": "$C", "out_channels": "$K",
    "num_features": "$C", "num_channels": "$C", "normalized_shape": "$C", "num_groups": 4,
    "embed_dim": "$C", "num_heads": 2, "input_size": "$C", "hidden_size": "$K", "num_layers": 1,
    "d_model": "$C", "nhead": 2, "kernel_size": 2, "output_size": 4, "upscale_factor": 2,
    "downscale_factor": 2, "groups": 2, "size": 3, "padding": 1, "value": 0.5, "p": 0.5,
    "threshold": 0.1, "dim": 1, "norm_type": 2.0, "in1_features": "$C", "in2_features": "$C",
    "scale_factor": 2.0, "start_dim": 1, "end_dim": -1, "lambd": 0.5, "min_val": -1.0, "max_val": 1.0,
    "alpha": 1.0, "negative_slope": 0.01, "beta": 1.0,
}

# Call (function) arguments.
FUNCTION_ARGS: dict[str, object] = {
    "dim": 1, "dims": [1], "dim0": 1, "dim1": 2, "kernel_size": 2, "output_size": 4,
    "normalized_shape": ["$C"], "num_groups": 4, "upscale_factor": 2, "downscale_factor": 2,
    "groups": 2, "pad": [1, 1], "p": 0.5, "lambd": 0.5, "negative_slope": 0.01, "threshold": 0.1,
    "value": 0.5, "min": -1.0, "max": 1.0, "min_val": -1.0, "max_val": 1.0, "alpha": 1.0, "beta": 1.0,
    "chunks": 2, "split_size_or_sections": 2, "split_size": 2, "sections": 2, "indices_or_sections": 2,
    "k": 2, "shifts": 1, "q": 0.5, "repeats": 2, "diagonal": 0, "shape": [-1], "start_dim": 1,
    "end_dim": -1, "size": 3, "scale_factor": 2.0, "decimals": 2, "n": 2, "weight": 0.5, "bins": 10,
    "ord": 2, "norm_type": 2.0, "eps": 1e-5, "source": 1, "destination": 2, "start": 0, "length": 2,
    "index": 0, "offset": 0, "sizes": [-1], "reps": [1, 2], "outer": 0, "exponential_average_factor": 0.1,
}
