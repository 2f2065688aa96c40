"""One step of TRL's ``AsyncGRPOTrainer`` on CPU with opforge's environment, a Dask cluster and a tiny random
model (requires ``pip install "opforge[rl]"``):

    python examples/trl_async_grpo.py

``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``) generates in a spawned rollout process that runs the
rollouts' tool calls in parallel and scores each rollout with the environment's ``get_reward`` - here the
grader's reward of the workspace - while the trainer trains. The environment factory
(``trl_environment_factory``) is pickled into that process with its Dask client (as the scheduler's address),
so every rollout's compile / verify / profile / submit runs on the cluster's workers.

On a GPU machine the generation server is vLLM (``vllm serve MODEL``, ``vllm_server_base_url``) and the weights
are synced over NCCL. On CPU this example stands in for the parts that need a GPU:

* the generation server is ``scripted_endpoint.py``'s ``/v1/completions`` in this process: the "policy" answers
  with the scripted agent's files as tool calls (write_file x 2, submit), the honest files and the wrong ones in
  turn (so a group's rewards differ and the step has a gradient), each answer one added token of the tiny
  tokenizer, and the log-probabilities are the tiny model's own for those tokens;
* weight sync is a no-op (``NoWeightSync``): the endpoint scores with the weights the trainer started from;
* the trainer's tree attention (FlashAttention-3 on GPU) runs as PyTorch SDPA per packed sequence
  (``cpu_stand_ins``), and the rollout worker is let start without vLLM installed.

The run prints each rollout's grader result as the policy read it from the ``submit`` tool's text (in the order
the rollouts finished; the rollout process keeps generating while the step trains, so there are more than the
step's), the rewards of the samples in each batch the trainer's data loader collated (a group's samples are its
rollouts, scored by ``get_reward``), and the reward the trainer logged. The step trains on the first batch: the
first groups scored (a group is ``num_generations`` rollouts of one row, started together at first; a new rollout
starts only when one has finished). The logged ``rewards/KernelToolEnv`` is the mean of the collated batches' means, and accelerate's data
loader collates the next batch before it hands over the current one: the log of a one-step run also counts the
batch after the step's, which is not trained on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

_here = Path(__file__).parent


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, _here / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agents = _example("scripted_agent")
endpoint = _example("scripted_endpoint")


def tool_call_answer(files: dict[str, str]) -> str:
    """The policy's answer: one Qwen2.5-style ``<tool_call>`` per file (``write_file``) and a ``submit``."""
    calls = [{"name": "write_file", "arguments": {"path": p, "content": t}} for p, t in files.items()]
    calls.append({"name": "submit", "arguments": {}})
    return "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)


def tiny_policy(answers: list[str], corpus: list[str], out_dir: str | Path):
    """A byte-level BPE tokenizer (400 tokens, trained on ``corpus``, Qwen2.5 chat template) with each of
    ``answers`` as one added token, and a random 1-layer Qwen2 (hidden size 16) saved with it to ``out_dir``.
    Returns ``(tokenizer, answer_token_ids)``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus + ["system user assistant tool"], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens(list(answers))
    tok.chat_template = qwen2_5_chat_template
    tok.padding_side = "left"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32768, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return tok, [tok.convert_tokens_to_ids(a) for a in answers]


class ScriptedPolicy:
    """The completer of the scripted endpoint: an answer token (each of ``answer_ids`` in turn, one per
    conversation) then end of turn, until the conversation holds the ``submit`` tool's result; then end of turn.
    Log-probabilities from the model at ``model_dir``. ``results`` collects, per finished conversation, the
    ``submit`` verdict and reward the policy read."""

    def __init__(self, model_dir: str | Path, tokenizer, answer_ids: list[int]):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.tokenizer = tokenizer
        self.answer_ids = answer_ids
        self._answers = 0
        self.results: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        eos = self.tokenizer.eos_token_id
        found = re.findall(r"submit: (\w+).*?reward: (-?[\d.]+)", self.tokenizer.decode(prompt_ids), re.S)
        if found:  # the answer's tool results are in the conversation: the rollout is over
            with self._lock:
                self.results.append({"status": found[-1][0], "reward": float(found[-1][1])})
            ids = [eos]
        else:
            with self._lock:
                ids = [self.answer_ids[self._answers % len(self.answer_ids)], eos]
                self._answers += 1
        return ids, self.logprobs(prompt_ids, ids)

    def logprobs(self, prompt_ids: list[int], ids: list[int]) -> list[float]:
        import torch

        with self._lock, torch.no_grad():
            logits = self.model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1:-1]
            lp = torch.log_softmax(logits.float(), dim=-1)
        return [float(lp[i, t]) for i, t in enumerate(ids)]


def batch_recorder(trainer_class, batches: list[list[dict[str, Any]]], reward_key: str):
    """A subclass of ``trainer_class`` (``AsyncGRPOTrainer``) that appends to ``batches``, per micro-batch its
    data loader collates, each sample's ``group`` (rollout group id) and ``reward`` (its ``reward_key`` metric, the
    reward the trainer trains and logs with), in collation order."""

    class Recording(trainer_class):
        def get_train_dataloader(self):
            loader = super().get_train_dataloader()
            collator = loader.collate_fn
            log_metrics = collator._log_metrics  # called by the collator once per micro-batch, with its samples

            def record(rows, all_examples, padded):
                batches.append([{"group": int(e["group_id"]), "reward": float(e["metrics"][reward_key])}
                                for e in all_examples])
                return log_metrics(rows, all_examples, padded)

            collator._log_metrics = record
            return loader

    return Recording


class NoWeightSync:
    """``AsyncGRPOTrainer``'s weight-transfer interface, doing nothing (no vLLM server to sync)."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


class _VarlenSDPA:
    """``flash_attn_varlen_func`` of the trainer's tree attention, on CPU: each packed sequence's queries attend
    to its keys (``cu_seqlens`` offsets) with PyTorch SDPA, causal aligned to the last key as FlashAttention
    does when a sequence has fewer queries than keys."""

    @staticmethod
    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=True,
                               window_size=(-1, -1), **_):
        import torch

        out = torch.empty_like(q)
        for i in range(len(cu_q) - 1):
            qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            if qe == qs:
                continue
            qi, ki, vi = (x.transpose(0, 1) for x in (q[qs:qe], k[ks:ke], v[ks:ke]))  # heads x len x dim
            mask = None
            if causal:
                lq, lk = qe - qs, ke - ks
                mask = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
            o = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=softmax_scale,
                                                                 enable_gqa=qi.shape[0] != ki.shape[0])
            out[qs:qe] = o.transpose(0, 1)
        return out


def cpu_stand_ins() -> None:
    """Let ``AsyncGRPOTrainer`` run on CPU: its tree attention runs ``_VarlenSDPA`` instead of FlashAttention-3
    (a GPU kernel), its MFU metric (which reads the CUDA device's name) is off, and its rollout worker starts
    without vLLM installed (the scripted endpoint serves the completions)."""
    from trl.experimental.async_grpo import async_grpo_trainer, async_rollout_worker, packing

    packing._flash_attn = lambda: _VarlenSDPA
    async_grpo_trainer.get_peak_flops_per_device = lambda *a, **k: None
    async_rollout_worker.is_vllm_available = lambda *a, **k: True


def async_grpo_step(tasks, out_dir: str | Path, client, env_config=None, build_root: str | None = None,
                    num_generations: int = 2) -> dict[str, Any]:
    """One ``AsyncGRPOTrainer`` step over ``tasks`` (a frame of opforge rows; the answers' files, honest and
    wrong, are written for the first row's public sizes) with the environment's heavy steps on ``client``'s
    cluster. Returns the trainer's first log entry (``log``), the rollouts' grader results as the policy read
    them, in the order they finished (``results``), and the samples of each micro-batch the data loader collated
    (``batches``, ``batch_recorder``): the first is the step's, the next was collated ahead and not trained on."""
    from opforge.harness.adapters.trl_env import KernelToolEnv, trl_dataset, trl_environment_factory
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    out_dir = Path(out_dir)
    code = tasks.iloc[0]["code"]
    answers = [tool_call_answer(agents.kernel_files(kind, "cpu", **agents.public_sizes(code)))
               for kind in ("honest", "wrong")]
    tok, answer_ids = tiny_policy(answers, [code], out_dir / "policy")
    policy = ScriptedPolicy(out_dir / "policy", tok, answer_ids)
    served = endpoint.Served(endpoint.scripted_app([], completer=policy))
    cpu_stand_ins()
    try:
        args = AsyncGRPOConfig(
            output_dir=str(out_dir / "run"), max_steps=1, num_generations=num_generations,
            per_device_train_batch_size=len(tasks) * num_generations, max_completion_length=8,
            max_tool_calling_iterations=1, vllm_server_base_url=served.url, token_budget=0, use_cpu=True,
            bf16=False, gradient_checkpointing=False, report_to=[], save_strategy="no", logging_steps=1,
            max_inflight_tasks=len(tasks) * num_generations, seed=0)
        batches: list[list[dict[str, Any]]] = []
        trainer = batch_recorder(AsyncGRPOTrainer, batches, f"rewards/{KernelToolEnv.__name__}")(
            model=str(out_dir / "policy"), args=args, train_dataset=trl_dataset(tasks), processing_class=tok,
            environment_factory=trl_environment_factory(tasks, env_config, client=client, build_root=build_root),
            weight_transfer=NoWeightSync())
        trainer.train()
    finally:
        served.stop()
    return {"log": trainer.state.log_history[0], "results": list(policy.results), "batches": batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for the model and the run (default: a temporary one)")
    args = ap.parse_args()
    import pandas as pd
    from distributed import Client, LocalCluster
    from opforge.harness.env import EnvConfig
    from opforge.harness.evaluate import EvalConfig

    # one row: the policy's answers are written for its sizes, so each group it answers honest and wrong in turn
    # holds rewards that differ (another row at other sizes would get -1 for both answers: no gradient)
    tasks = pd.DataFrame([agents.task_row()])
    config = EnvConfig(final=EvalConfig(profile_compile=False, timing_trials=5, warmup=1), include_rules=False)
    # tcp, so the spawned rollout process reaches the scheduler; the workers run in this process
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            tempfile.TemporaryDirectory() as tmp:
        out = async_grpo_step(tasks, args.out or tmp, client, config)
    print("rollouts in the order they finished, as the policy read the submit tool's text:")
    for i, r in enumerate(out["results"]):
        print(f"  {i}: {r['status']}, reward {r['reward']:g}")
    for i, batch in enumerate(out["batches"]):
        when = "trained by the step" if i == 0 else "collated ahead, not trained on"
        print(f"batch {i} ({when}): " + ", ".join(f"group {s['group']} reward {s['reward']:g}" for s in batch))
    log = out["log"]
    print(f"trainer logged: rewards/KernelToolEnv {log.get('rewards/KernelToolEnv')} (the mean of the batches' "
          f"means), loss {log.get('loss')}, grad_norm {log.get('grad_norm')}")


if __name__ == "__main__":
    main()
