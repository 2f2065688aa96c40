"""A scripted (non-LLM) agent for ``opforge.harness.env.KernelEnv``, and the small task it solves.

The task: ``relu(x * scale + 1)`` over ``x`` of shape ``[batch_size, seq_len, channels]`` with a learnable
per-channel ``scale``, in the composer's layout (module-level size constants, ``compose.graphs.render``), so that its
hidden shape variants (``compose.variants``) move the batch and the sequence length.

The agent writes one kernel source holding three functions and a ``model_new.py`` that calls one of them:

* ``honest``: the loop over every element, any shape;
* ``hardcoded``: the output allocated at the public shape (the sizes baked into the source, as a kernel
  tuned for the shape it was shown would do): correct there, wrong on the hidden variants;
* ``wrong``: ``relu(x * scale + 2)``.

All three share one kernel source, so an episode of any kind reuses one build (``harness.build`` caches by
source hash). C++ on CPU, CUDA on a GPU. Used by ``examples/env_episodes.py``, ``scripted_endpoint.py``,
``trl_async_grpo.py``, ``benchmarks/env_episodes.py`` and the tests.

    python examples/scripted_agent.py /tmp/opforge-demo/tasks.parquet   # the task as a one-row dataset
"""

from __future__ import annotations

from typing import Any

KINDS = ("honest", "hardcoded", "wrong")


def task_source(batch_size: int = 16, seq_len: int = 32, channels: int = 64) -> str:
    """The task's KernelBench source at the given sizes."""
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x * scale + 1) with a per-channel scale."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(channels))

    def forward(self, x):
        return torch.relu(x * self.scale + 1.0)


batch_size = {batch_size}
seq_len = {seq_len}
channels = {channels}


def get_inputs():
    x = torch.randn(batch_size, seq_len, channels)
    return [x]


def get_init_inputs():
    return []
'''


def task_row(task_id: str = "scale_relu", batch_size: int = 16, seq_len: int = 32, channels: int = 64,
             variants: bool = True) -> dict[str, Any]:
    """A dataset row of the task (``size_context`` set, so sequence lengths move too), with its hidden
    ``shape_variants`` computed as the publish step does."""
    row = {"task_id": task_id, "code": task_source(batch_size, seq_len, channels), "data_source": "torch#3",
           "dtype": "float32", "size_context": "gpt2", "shape_variants": "[]"}
    if variants:
        from opforge.compose.variants import shape_variants

        row["shape_variants"] = shape_variants(row).to_json()
    return row


_CPP = '''#include "registry.h"

// relu(x * scale + bias) over a contiguous float32 x whose last dim is scale's length
static void scale_relu_loop(const float* px, const float* ps, float* py, int64_t n, int64_t c, float bias) {
    for (int64_t i = 0; i < n; ++i) {
        float v = px[i] * ps[i % c] + bias;
        py[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor scale_relu_honest(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    scale_relu_loop(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), xc.numel(),
                    scale.numel(), 1.0f);
    return y;
}

// tuned for the shape in model.py: B x L x C baked in
torch::Tensor scale_relu_hardcoded(torch::Tensor x, torch::Tensor scale) {
    const int64_t B = @B@, L = @L@, C = @C@;
    auto xc = x.contiguous();
    auto y = torch::zeros({B, L, C}, xc.options());
    const int64_t n = std::min<int64_t>(B * L * C, xc.numel());
    scale_relu_loop(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), n, C, 1.0f);
    return y;
}

torch::Tensor scale_relu_wrong(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    scale_relu_loop(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), xc.numel(),
                    scale.numel(), 2.0f);
    return y;
}

OPFORGE_EXPORT(scale_relu_honest, "relu(x * scale + 1)");
OPFORGE_EXPORT(scale_relu_hardcoded, "relu(x * scale + 1) at the public shape only");
OPFORGE_EXPORT(scale_relu_wrong, "relu(x * scale + 2)");
'''

_CU = '''#include "registry.h"
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_relu_kernel(const float* x, const float* s, float* y, int64_t n, int64_t c, float bias) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] * s[i % c] + bias;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

static void launch(const float* x, const float* s, float* y, int64_t n, int64_t c, float bias) {
    if (n == 0) return;
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    scale_relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream().stream()>>>(x, s, y, n, c, bias);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor scale_relu_honest(torch::Tensor x, torch::Tensor scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), scale.numel(), 1.0f);
    return y;
}

// tuned for the shape in model.py: B x L x C baked in
torch::Tensor scale_relu_hardcoded(torch::Tensor x, torch::Tensor scale) {
    const int64_t B = @B@, L = @L@, C = @C@;
    auto xc = x.contiguous();
    auto y = torch::zeros({B, L, C}, xc.options());
    const int64_t n = std::min<int64_t>(B * L * C, xc.numel());
    launch(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), n, C, 1.0f);
    return y;
}

torch::Tensor scale_relu_wrong(torch::Tensor x, torch::Tensor scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), scale.numel(), 2.0f);
    return y;
}

OPFORGE_EXPORT(scale_relu_honest, "relu(x * scale + 1)");
OPFORGE_EXPORT(scale_relu_hardcoded, "relu(x * scale + 1) at the public shape only");
OPFORGE_EXPORT(scale_relu_wrong, "relu(x * scale + 2)");
'''


def kernel_files(kind: str, device: str = "cpu", batch_size: int = 16, seq_len: int = 32,
                 channels: int = 64) -> dict[str, str]:
    """``model_new.py`` and the kernel source of agent ``kind`` for the task at the given public sizes."""
    if kind not in KINDS:
        raise ValueError(f"unknown agent kind {kind!r}; known: {', '.join(KINDS)}")
    src = (_CU if device == "cuda" else _CPP).replace("@B@", str(batch_size)).replace("@L@", str(seq_len)) \
        .replace("@C@", str(channels))
    model_new = f'''import torch
import torch.nn as nn

import opforge_kernels


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn({channels}))

    def forward(self, x):
        return opforge_kernels.scale_relu_{kind}(x, self.scale)
'''
    return {"model_new.py": model_new, "kernels/scale_relu" + (".cu" if device == "cuda" else ".cpp"): src}


def public_sizes(code: str) -> dict[str, int]:
    """The task's public ``batch_size``, ``seq_len``, ``channels`` (what an agent reads off ``model.py``)."""
    from opforge.task.sizes import size_constants

    sizes = size_constants(code)
    return {k: sizes[k] for k in ("batch_size", "seq_len", "channels")}


def scripted_agent(kind: str, device: str = "cpu", profile: bool = False):
    """An agent ``(env, prompt) -> None`` of ``kind`` that reads model.py, writes its files, compiles,
    verifies (and profiles when asked) and submits; it stops early when the build fails."""

    def agent(env, prompt: str) -> None:
        sizes = public_sizes(env.read_file("model.py"))
        for path, text in kernel_files(kind, device, **sizes).items():
            env.write_file(path, text)
        if not env.compile().startswith("compiled"):
            return
        env.verify()
        if profile:
            env.profile()
        env.submit()

    agent.__name__ = f"scripted_{kind}"
    return agent


def main() -> None:
    import argparse
    from pathlib import Path

    import pandas as pd

    ap = argparse.ArgumentParser(description="Write the scripted agent's task (task_id scale_relu, with its hidden "
                                             "shape variants) as a one-row opforge dataset.")
    ap.add_argument("out", help="the .parquet file to write")
    args = ap.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([task_row()]).to_parquet(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
