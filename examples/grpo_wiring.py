"""How to wire opforge into TRL's ``GRPOTrainer``, both ways (requires ``pip install "opforge[rl]"``).

1. Multi-turn, the environment owns the reward: ``environment_factory=trl_environment_factory(dataset)``. TRL
   calls ``reset(**row)`` per rollout (the row's ``task_id`` picks the task and the task prompt is appended to
   the row's prompt), offers the environment's methods as tools (write_file, read_file, list_files, compile,
   verify, profile, submit), runs the tool calls the model makes, and scores each finished rollout with
   ``get_reward()`` (the grader's reward).
2. Single turn, a batch reward function: ``reward_funcs=KernelReward(dataset)``; the completion holds the files
   in the answer format of RULES.md, evaluated in parallel on Dask workers.

    python examples/grpo_wiring.py --model Qwen/Qwen3-0.6B --dataset ORG/NAME --mode env

The model must have a chat template that supports tool calls for the environment form (Qwen3 does). On a GPU
machine pass ``--device cuda``: kernels are then CUDA and evaluations run on a GPU worker.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a causal LM (Hub id or path) with a tool-calling chat template")
    ap.add_argument("--dataset", required=True, help="an opforge dataset: Hub id, hf/ folder or .parquet")
    ap.add_argument("--mode", choices=["env", "reward"], default="env")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--tasks", type=int, default=64, help="training rows (the first N tasks)")
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--output-dir", default="runs/grpo")
    args = ap.parse_args()

    from opforge.engine.cluster import open_cluster
    from opforge.harness.adapters.trl_env import trl_dataset, trl_environment_factory
    from opforge.harness.dataset import load_tasks
    from opforge.harness.env import EnvConfig
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.rl import KernelReward
    from trl import GRPOConfig, GRPOTrainer

    tasks = load_tasks(args.dataset).reset_index(drop=True).head(args.tasks)
    final = EvalConfig(device=args.device)
    # the heavy steps of every environment (or the batch reward) run on this cluster's workers
    cluster = open_cluster(args.device)
    config = GRPOConfig(output_dir=args.output_dir, max_steps=args.max_steps, num_generations=8,
                        per_device_train_batch_size=8, max_completion_length=4096, max_tool_calling_iterations=50,
                        logging_steps=1, report_to=[])
    try:
        if args.mode == "env":
            trainer = GRPOTrainer(
                model=args.model, args=config, train_dataset=trl_dataset(tasks),
                environment_factory=trl_environment_factory(tasks, EnvConfig(device=args.device, final=final,
                                                                             max_turns=50),
                                                            client=cluster.client))
        else:
            trainer = GRPOTrainer(model=args.model, args=config, train_dataset=trl_dataset(tasks, multi_turn=False),
                                  reward_funcs=KernelReward(tasks, final, client=cluster.client))
        trainer.train()
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
