"""Run the scripted (non-LLM) agent through a few episodes of the trainer-facing environment, end to end.

    python examples/env_episodes.py                 # CPU: C++ kernels
    python examples/env_episodes.py --device cuda   # a GPU: CUDA kernels

Each episode: ``KernelEnv.reset(task_id)`` gives the prompt; the agent reads ``model.py``, writes its kernel and
``model_new.py``, compiles, verifies, profiles and submits; ``final_reward()`` is the grader's reward. Three
agents: an honest kernel (reward >= 1), one that hard-codes the public shape (passes ``verify`` on the public
shape, fails the hidden shape variants at ``submit``: -1) and a wrong one (-1). Every tool's text is printed,
as a model would see it.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pandas as pd
from opforge.harness.env import EnvConfig, KernelEnv
from opforge.harness.evaluate import EvalConfig

_spec = importlib.util.spec_from_file_location("scripted_agent", Path(__file__).with_name("scripted_agent.py"))
agents = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agents)


class Printing:
    """Wraps a ``KernelEnv`` and prints every tool call and the text it returns."""

    def __init__(self, env: KernelEnv):
        self.env = env

    def __getattr__(self, name):
        fn = getattr(self.env, name)
        if name not in ("write_file", "read_file", "list_files", "compile", "verify", "profile", "submit"):
            return fn

        def call(*args, **kwargs):
            text = fn(*args, **kwargs)
            shown = [a if len(str(a)) < 40 else f"<{len(str(a))} chars>" for a in args]
            print(f"\n>>> {name}({', '.join(map(str, shown))})\n{text if name != 'read_file' else text[:300]}")
            return text

        return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    tasks = pd.DataFrame([agents.task_row()])
    print("hidden shape variants of the task (never shown to the agent):", tasks.iloc[0]["shape_variants"])
    final = EvalConfig(device=args.device, timing_trials=5, warmup=1, profile_compile=args.device == "cuda")
    env = KernelEnv(tasks, EnvConfig(device=args.device, final=final, max_turns=20, include_rules=False))
    try:
        for kind in agents.KINDS:
            print(f"\n=== episode: {kind} agent ===")
            prompt = env.reset("scale_relu")
            print(prompt[:400], "...")
            agents.scripted_agent(kind, args.device, profile=True)(Printing(env), prompt)
            print(f"\n=== {kind}: reward {env.final_reward():g} after {env.turns} tool calls ===")
    finally:
        env.close()


if __name__ == "__main__":
    main()
