"""The trainer-facing environment (harness/env.py) on CPU: a scripted agent writes a real C++ kernel through the
tools; the honest one is rewarded, the one that hard-codes the public shape fails the hidden variants, the wrong
one gets -1; episodes run in parallel on a Dask cluster; TRL's GRPOTrainer runs a training step with the batch
reward and with the environment; OpenEnv serves it.

Every kernel of the scripted agent lives in one source (examples/scripted_agent.py), so the whole module builds
one extension."""

import importlib.util
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.env import EnvConfig, EnvError, KernelEnv
from opforge.harness.evaluate import EvalConfig

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("scripted_agent", ROOT / "examples" / "scripted_agent.py")
agents = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agents)

FAST = EvalConfig(profile_compile=False, timing_trials=3, warmup=1)
CONFIG = EnvConfig(final=FAST, include_rules=False)


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("env_extensions"))


@pytest.fixture(scope="module")
def tasks():
    row = agents.task_row()
    # the same task at other public sizes, for the TRL test: the scripted model_new.py of the first does not fit
    other = agents.task_row("scale_relu_c32", channels=32)
    return pd.DataFrame([row, other])


def test_prompt_workspace_and_tool_rules(tasks, build_root):
    env = KernelEnv(tasks, EnvConfig(max_turns=5, final=FAST), build_root=build_root)
    row = tasks.iloc[0]
    prompt = env.reset("scale_relu")
    ws = env.workspace
    assert (ws / "model.py").read_text() == row["code"] and row["code"] in prompt
    assert "What counts as cheating" in prompt  # RULES.md in full
    # the hidden variants are nowhere in the workspace or the prompt
    variants = json.loads(row["shape_variants"])
    assert len(variants) >= 2
    hidden = [json.dumps(v["input_shapes"][0]) for v in variants]
    everything = prompt + "".join(f.read_text(errors="replace") for f in ws.rglob("*") if f.is_file())
    assert "shape_variants" not in everything and not any(h in everything for h in hidden)
    assert env.write_file("model.py", "x = 1").startswith("write_file: model.py cannot be written")
    assert "cannot be written" in env.write_file("kernels/binding.cpp", "")
    assert "not a path inside" in env.write_file("../escape.py", "")
    assert env.read_file("../../etc/passwd").startswith("read_file: no file")
    assert (ws / "model.py").read_text() == row["code"]
    text = env.list_files()  # the fifth call ends the episode
    assert "model.py" in text and "kernels/registry.h" in text and "turn budget of 5" in text and env.done
    assert env.verify().startswith("the episode is over")
    assert env.final_reward() == -1.0 and env.result is None  # model_new.py never written: not graded
    with pytest.raises(EnvError, match="no task"):
        env.reset("nope")
    env.reset("scale_relu_c32")
    assert not ws.exists() and env.turns == 0 and not env.done  # the old workspace is gone
    old = env.workspace
    env.close()
    assert not old.exists()


@pytest.mark.slow
def test_scripted_agents_honest_hardcoded_and_wrong(tasks, build_root):
    """The must-show of the issue on CPU: honest >= 1, a kernel hard-coding the public shape fails on the hidden
    variants, a wrong kernel -1; the three episodes run at once on a Dask cluster (one build, shared)."""
    from distributed import Client, LocalCluster
    from opforge.harness.episodes import episode_summary, run_episodes

    cluster = LocalCluster(n_workers=1, threads_per_worker=3, processes=False, dashboard_address=None)
    client = Client(cluster)
    try:
        kinds = list(agents.KINDS)
        results = run_episodes([agents.scripted_agent(k) for k in kinds], ["scale_relu"] * 3, tasks, CONFIG,
                               client=client, parallel=3, build_root=build_root, progress=False)
    finally:
        client.close()
        cluster.close()
    by = {r["agent"]: r for r in results}
    honest, hard, wrong = by["scripted_honest"], by["scripted_hardcoded"], by["scripted_wrong"]
    assert honest["reward"] >= 1.0 and honest["status"] == "correct", honest
    assert [t["tool"] for t in honest["tools"]] == ["read_file", "write_file", "write_file", "compile", "verify",
                                                    "submit"]
    # the hard-coded kernel passes verify (public shape) and fails the final check on a hidden variant
    assert [t["status"] for t in hard["tools"]][-2:] == ["correct", "incorrect"], hard
    assert hard["reward"] == -1.0
    assert wrong["reward"] == -1.0 and wrong["status"] == "incorrect", wrong
    summary = episode_summary(results, 60.0)
    assert summary["episodes"] == 3 and summary["reward_counts"]["-1"] == 2 and summary["episodes_per_min"] == 3.0


@pytest.mark.slow
def test_trl_grpo_step_with_the_environment_and_the_batch_reward(tasks, build_root, tmp_path, monkeypatch):
    """One GRPO step on CPU with a tiny random Qwen2 and a BPE tokenizer built here, twice: with the environment
    (TRL parses the completion's tool calls, runs them on the environment, then asks it for the reward) and
    with the batch reward. Generation is pinned to one added token that holds the whole scripted answer, so
    the rewards are known: the honest files score >= 1 on the task they were written for and -1 on the task
    with other channels."""
    import torch
    from distributed import Client, LocalCluster
    from opforge.harness.adapters.trl_env import trl_dataset, trl_environment_factory
    from opforge.harness.rl import KernelReward
    from opforge.harness.solution import format_completion
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.setenv("OPFORGE_CACHE", str(Path(build_root).parent))
    row = tasks.iloc[0].to_dict()
    files = agents.kernel_files("honest", "cpu", **agents.public_sizes(row["code"]))
    calls = [{"name": "write_file", "arguments": {"path": p, "content": t}} for p, t in files.items()]
    tool_answer = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls + [{"name": "submit",
                                                                                          "arguments": {}}])
    text_answer = format_completion(files)

    def tokenizer_and_model(answer: str):
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        bpe.train_from_iterator([row["code"], "system user assistant tool"], trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        tok.add_tokens([answer])
        tok.chat_template = qwen2_5_chat_template
        tok.padding_side = "left"
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32768, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, tie_word_embeddings=False))
        answer_id = tok.convert_tokens_to_ids(answer)
        # sample only the answer token or the end of turn, and the answer first
        suppress = [i for i in range(len(tok)) if i not in (answer_id, tok.eos_token_id)]
        return tok, model, {"suppress_tokens": suppress, "begin_suppress_tokens": [tok.eos_token_id]}

    def args(name: str, gen: dict) -> GRPOConfig:
        return GRPOConfig(output_dir=str(tmp_path / name), per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=4, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                          save_strategy="no", max_tool_calling_iterations=1, generation_kwargs=gen, seed=0)

    # the environment form
    tok, model, gen = tokenizer_and_model(tool_answer)
    factory, made = trl_environment_factory(tasks, CONFIG, build_root=build_root), []

    def recording_factory():
        made.append(factory())
        return made[-1]

    trainer = GRPOTrainer(model=model, args=args("env", gen), train_dataset=trl_dataset(tasks),
                          processing_class=tok, environment_factory=recording_factory)
    trainer.train()
    logged = trainer.state.log_history[0]
    envs = [e.episode for e in made if e.episode.task_id is not None]  # TRL probes one instance unused
    assert len(envs) == 4  # 2 tasks x 2 generations
    rewards = {e.task_id: e.reward for e in envs}
    assert rewards["scale_relu"] >= 1.0 and rewards["scale_relu_c32"] == -1.0, rewards
    assert all(e.history[-1]["tool"] == "submit" for e in envs)
    assert logged["tools/call_frequency"] >= 3 and logged["tools/failure_frequency"] == 0
    assert logged["rewards/KernelToolEnv/mean"] == pytest.approx(sum(e.reward for e in envs) / len(envs))
    assert "loss" in logged and logged["completions/mean_length"] >= 1
    # the batch reward form (single turn: the completion holds the files)
    tok, model, gen = tokenizer_and_model(text_answer)
    cluster = LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None)
    client = Client(cluster)
    try:
        reward = KernelReward(tasks, FAST, client=client, build_root=build_root)
        trainer = GRPOTrainer(model=model, args=args("batch", gen), train_dataset=trl_dataset(tasks, multi_turn=False),
                              processing_class=tok, reward_funcs=reward)
        trainer.train()
    finally:
        client.close()
        cluster.close()
    logged = trainer.state.log_history[0]
    by_task = {r["task_id"]: r["reward"] for r in reward.last_results}
    assert by_task["scale_relu"] >= 1.0 and by_task["scale_relu_c32"] == -1.0, reward.last_results
    assert logged["rewards/opforge_kernel_reward/mean"] == pytest.approx(
        sum(r["reward"] for r in reward.last_results) / len(reward.last_results))


def test_openenv_server_session(tasks, build_root):
    """OpenEnv's own FastAPI server over a WebSocket session: reset, tool steps, state; a submitted wrong kernel
    comes back done with reward -1."""
    from fastapi.testclient import TestClient
    from opforge.harness.adapters.openenv_env import openenv_app

    files = agents.kernel_files("wrong", "cpu", **agents.public_sizes(tasks.iloc[0]["code"]))
    client = TestClient(openenv_app(tasks, CONFIG, build_root=build_root))
    assert set(client.get("/schema").json()) >= {"action", "observation", "state"}

    def send(ws, msg):
        ws.send_text(json.dumps(msg))
        return json.loads(ws.receive_text())["data"]

    with client.websocket_connect("/ws") as ws:
        first = send(ws, {"type": "reset", "data": {"task_id": "scale_relu"}})
        assert "Task scale_relu" in first["observation"]["text"] and first["done"] is False
        for path, text in files.items():
            got = send(ws, {"type": "step", "data": {"tool": "write_file", "path": path, "content": text}})
            assert got["observation"]["text"].startswith("wrote")
        got = send(ws, {"type": "step", "data": {"tool": "submit"}})
        assert got["done"] is True and got["reward"] == -1.0 and "incorrect" in got["observation"]["text"]
        state = send(ws, {"type": "state"})
        assert state["step_count"] == 3 and state["reward"] == -1.0 and state["task_id"] == "scale_relu"


@pytest.mark.slow
def test_env_benchmark_script_on_cpu(tmp_path, build_root):
    """benchmarks/env_episodes.py (the H200 must-show) runs end to end on CPU with a tiny count."""
    import subprocess
    import sys

    out = tmp_path / "episodes.json"
    env = {**os.environ, "OPFORGE_CACHE": str(Path(build_root).parent)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "env_episodes.py"), "--device", "cpu",
                           "--episodes", "3", "--parallel", "3", "--workers", "1", "--build-root", build_root,
                           "--out", str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    s = res["summary"]
    assert s["episodes"] == 3 and s["episodes_per_min"] > 0
    assert s["per_agent_mean_reward"]["scripted_honest"] >= 1.0
    assert s["per_agent_mean_reward"]["scripted_hardcoded"] == -1.0
    assert s["per_agent_mean_reward"]["scripted_wrong"] == -1.0
    partial = [json.loads(line) for line in out.with_suffix(".partial.jsonl").read_text().splitlines()]
    assert sorted(p["episode"] for p in partial) == [0, 1, 2]  # each episode kept as it ended
    assert sorted(p["reward"] for p in partial) == sorted(e["reward"] for e in res["episodes"])


def test_verifiers_taskset_and_episode_loop(tasks, build_root, tmp_path, monkeypatch):
    """verifiers v1: the taskset yields one task per row (its real Task / TaskData types) and ``play`` drives an
    interaction reply by reply: files written and checked, feedback returned, SUBMIT grades."""
    import asyncio

    import verifiers.v1 as vf
    from opforge.harness.adapters.verifiers_env import (
        KernelTask,
        KernelTaskset,
        KernelTasksetConfig,
        KernelVerifiersEnv,
        play,
    )
    from opforge.harness.solution import format_completion
    from verifiers.v1.utils.loaders import environment_class, taskset_class

    # verifiers' own plugin loader finds the taskset and its env through a top-level module
    (tmp_path / "opforge_kernels_taskset.py").write_text(
        "from opforge.harness.adapters.verifiers_env import *  # noqa: F403\n"
        "from opforge.harness.adapters.verifiers_env import __all__  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert taskset_class("opforge_kernels_taskset") is KernelTaskset
    assert environment_class("opforge_kernels_taskset") is KernelVerifiersEnv
    path = tmp_path / "tasks.parquet"
    tasks.to_parquet(path, index=False)
    loaded = list(KernelTaskset(KernelTasksetConfig(dataset=str(path))))
    assert [t.data.task_id for t in loaded] == ["scale_relu", "scale_relu_c32"]
    assert isinstance(loaded[0], KernelTask) and issubclass(KernelVerifiersEnv, vf.Env)
    assert tasks.iloc[0]["code"] in loaded[0].data.prompt_text and "SUBMIT" in loaded[0].data.prompt_text

    files = agents.kernel_files("honest", "cpu", **agents.public_sizes(tasks.iloc[0]["code"]))
    replies = ["I will write the kernel.", format_completion(files), "SUBMIT"]
    seen: list[str | None] = []

    class Interaction:  # the surface of verifiers' Interaction that `play` uses
        async def turn(self, message=None):
            seen.append(message)
            return vf.Segment(messages=[vf.AssistantMessage(content=replies[len(seen) - 1])])

    env = KernelEnv(tasks, CONFIG, build_root=build_root)
    try:
        env.reset("scale_relu")
        reward = asyncio.run(play(env, Interaction(), max_turns=5))
    finally:
        env.close()
    assert reward >= 1.0 and env.result["status"] == "correct"
    assert seen[0] is None and seen[1].startswith("No file in your reply")
    assert "wrote" in seen[2] and "compiled" in seen[2] and "verify: correct" in seen[2]
