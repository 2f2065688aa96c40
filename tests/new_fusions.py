"""Fused tasks written for opforge's tests that pose no KernelBench problem (levels 1–3): the contamination
filter must accept every one. Each is a KernelBench-format source; sizes are small so they also run on CPU.
"""

from __future__ import annotations

_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _task(model: str, inputs: str, init: str = "[]") -> str:
    return (_HEADER + model.strip() + "\n\n\ndef get_inputs():\n    return " + inputs
            + "\n\n\ndef get_init_inputs():\n    return " + init + "\n")


NEW_FUSIONS = {
    "cumsum_exp_mean": _task("""
class Model(nn.Module):
    def forward(self, x):
        return torch.exp(torch.cumsum(x, dim=-1) * 0.01).mean(dim=1)
""", "[torch.randn(8, 64, 32)]"),
    "layernorm_hardswish_amax": _task("""
class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return F.hardswish(self.norm(x)).amax(dim=-1)
""", "[torch.randn(16, 128, 96)]", "[96]"),
    "sort_diff_abs": _task("""
class Model(nn.Module):
    def forward(self, x):
        s, _ = torch.sort(x, dim=-1)
        return torch.abs(torch.diff(s, dim=-1)).sum(dim=-1)
""", "[torch.randn(32, 256)]"),
    "groupnorm_logsigmoid_flip": _task("""
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gn = nn.GroupNorm(4, c)

    def forward(self, x):
        return torch.flip(F.logsigmoid(self.gn(x)), dims=[-1])
""", "[torch.randn(4, 16, 32, 32)]", "[16]"),
    "embedding_bag_style": _task("""
class Model(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.emb = nn.Embedding(n, d)

    def forward(self, idx):
        return torch.tanh(self.emb(idx).sum(dim=1))
""", "[torch.randint(0, 100, (8, 12))]", "[100, 32]"),
    "topk_softmax_gather": _task("""
class Model(nn.Module):
    def forward(self, x):
        vals, idx = torch.topk(x, k=8, dim=-1)
        w = torch.softmax(vals, dim=-1)
        return (w * idx.float()).sum(dim=-1)
""", "[torch.randn(64, 512)]"),
    "rotary_embedding": _task("""
class Model(nn.Module):
    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
""", "[torch.randn(2, 4, 64, 32), torch.randn(64, 32), torch.randn(64, 32)]"),
    "sdpa_residual_rmsnorm": _task("""
class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, q, k, v):
        h = F.scaled_dot_product_attention(q, k, v) + q
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
""", "[torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16)]", "[16]"),
    "atan2_remainder": _task("""
class Model(nn.Module):
    def forward(self, a, b):
        return torch.remainder(torch.atan2(a, b), 1.5)
""", "[torch.randn(128, 128), torch.randn(128, 128)]"),
    "unfold_window_max": _task("""
class Model(nn.Module):
    def forward(self, x):
        win = x.unfold(-1, 5, 1)
        return win.amax(dim=-1) - win.amin(dim=-1)
""", "[torch.randn(16, 32, 200)]"),
    "lrn_hardtanh": _task("""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lrn = nn.LocalResponseNorm(3)

    def forward(self, x):
        return F.hardtanh(self.lrn(x), -0.5, 0.5)
""", "[torch.randn(4, 8, 16, 16)]"),
    "pixel_shuffle_mish": _task("""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = nn.PixelShuffle(2)

    def forward(self, x):
        return F.mish(self.ps(x)).std(dim=1)
""", "[torch.randn(4, 16, 24, 24)]"),
    "gated_linear_unit_cumprod": _task("""
class Model(nn.Module):
    def forward(self, x):
        return torch.cumprod(F.glu(x, dim=-1).clamp(0.5, 1.5), dim=1)
""", "[torch.randn(8, 64, 64)]"),
    "bucketize_histogram": _task("""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("edges", torch.linspace(-2, 2, 17))

    def forward(self, x):
        b = torch.bucketize(x, self.edges)
        return F.one_hot(b, 18).float().mean(dim=1)
""", "[torch.randn(32, 100)]"),
    "logcumsumexp_sub": _task("""
class Model(nn.Module):
    def forward(self, x):
        return torch.logcumsumexp(x, dim=1) - torch.logsumexp(x, dim=1, keepdim=True)
""", "[torch.randn(16, 300)]"),
}
