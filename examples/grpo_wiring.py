"""How to wire opforge into TRL's ``GRPOTrainer``, both ways (requires ``pip install "opforge[rl]"``).

1. Multi-turn, the environment owns the reward: ``environment_factory=trl_environment_factory(dataset)``. TRL
   calls ``reset(**row)`` per rollout (the row's ``task_id`` picks the task and the task prompt is appended to
   the row's prompt), offers the environment's methods as tools (write_file, read_file, list_files, compile,
   verify, profile, submit), runs the tool calls the model makes, and scores each finished rollout with
   ``get_reward()`` (the grader's reward).
2. Single turn, a batch reward function: ``reward_funcs=KernelReward(dataset)``; the completion holds the files
   in the answer format of RULES.md, evaluated in parallel on Dask workers.

    python examples/grpo_wiring.py --model Qwen/Qwen3-0.6B --dataset ORG/NAME --mode env
    python examples/grpo_wiring.py --dataset releases/opforge-ops-6k --mode reward --max-steps 1   # offline, CPU

The model must have a chat template that supports tool calls for the environment form (Qwen3 does). Without
``--model`` (or with ``--model tiny``) a tiny random Qwen2 with a small byte-level tokenizer is made in the output
folder, so the wiring runs offline; it writes nothing useful, it only shows the loop turning. ``--device``
defaults to ``cuda`` when a GPU is visible, else ``cpu`` (kernels are then C++ and the trainer runs on the CPU in
float32; on CUDA it trains in bf16 where the GPU supports it). On CPU only rows whose inputs are small are used
(``harness.dataset.small_tasks``): released rows are sized for an H200. The run's files go to ``--output-dir``
(default: a new temporary folder, printed at the end).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def tiny_model(out_dir: str | Path) -> str:
    """A random 1-layer Qwen2 (hidden size 32) and a 400-token byte-level BPE tokenizer with the Qwen2.5 chat
    template (tool calls), saved to ``out_dir``; returns the folder. Needs no network."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ["import torch", "class ModelNew(nn.Module):", "```python model_new.py", "system user assistant tool"]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen2_5_chat_template
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=65536, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return str(out_dir)


def _default_device() -> str:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        return "cuda" if subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0 else "cpu"
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a causal LM (Hub id or local path) with a tool-calling chat "
                    "template; 'tiny' (default): a tiny random model made offline in the output folder")
    ap.add_argument("--dataset", required=True, help="an opforge dataset: Hub id, hf/ folder or .parquet")
    ap.add_argument("--mode", choices=["env", "reward"], default="env")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="default: cuda when nvidia-smi lists a GPU, else cpu")
    ap.add_argument("--tasks", type=int, default=64, help="training rows (the first N tasks; on CPU of the small ones)")
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--max-completion-length", type=int, default=4096)
    ap.add_argument("--output-dir", default=None, help="default: a new temporary folder")
    args = ap.parse_args()
    device = args.device or _default_device()
    out_dir = Path(args.output_dir or tempfile.mkdtemp(prefix="opforge-grpo-"))

    import torch
    from opforge.engine.cluster import open_cluster
    from opforge.harness.adapters.trl_env import trl_dataset, trl_environment_factory
    from opforge.harness.dataset import load_tasks, small_tasks
    from opforge.harness.env import EnvConfig
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.rl import KernelReward
    from trl import GRPOConfig, GRPOTrainer

    tasks = load_tasks(args.dataset)
    if device == "cpu":
        tasks = small_tasks(tasks)
    tasks = tasks.reset_index(drop=True).head(args.tasks)
    if tasks.empty:
        raise SystemExit(f"error: {args.dataset}: no task to train on" + (" (none small enough for a CPU)"
                                                                         if device == "cpu" else ""))
    model = tiny_model(out_dir / "tiny-model") if args.model == "tiny" else args.model
    final = EvalConfig(device=device)
    # the heavy steps of every environment (or the batch reward) run on this cluster's workers
    cluster = open_cluster(device)
    bf16 = device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    config = GRPOConfig(output_dir=str(out_dir / "run"), max_steps=args.max_steps, num_generations=8,
                        per_device_train_batch_size=8, max_completion_length=args.max_completion_length,
                        max_tool_calling_iterations=50, logging_steps=1, report_to=[], use_cpu=device == "cpu",
                        bf16=bf16, save_strategy="no")
    try:
        if args.mode == "env":
            trainer = GRPOTrainer(
                model=model, args=config, train_dataset=trl_dataset(tasks),
                environment_factory=trl_environment_factory(tasks, EnvConfig(device=device, final=final,
                                                                             max_turns=50),
                                                            client=cluster.client))
        else:
            trainer = GRPOTrainer(model=model, args=config, train_dataset=trl_dataset(tasks, multi_turn=False),
                                  reward_funcs=KernelReward(tasks, final, client=cluster.client))
        trainer.train()
    finally:
        cluster.close()
    log = trainer.state.log_history[0] if trainer.state.log_history else {}
    print(f"trained {trainer.state.global_step} step(s) on {device}; first log: reward {log.get('reward')}, "
          f"loss {log.get('loss')}; files in {out_dir}")


if __name__ == "__main__":
    main()
