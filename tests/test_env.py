"""The trainer-facing environment (harness/env.py) on CPU: a scripted agent writes a real C++ kernel through the
tools; the honest one is rewarded, the one that hard-codes the public shape fails the hidden variants, the wrong
one gets -1; episodes run in parallel on a Dask cluster. The trainer adapters through each library's own entry
point: TRL's GRPOTrainer (batch reward and environment) and AsyncGRPOTrainer (environment pickled with a Dask
client into its rollout process), OpenEnv's server and typed client (and ``openenv validate`` of the shipped
directory), ``vf-eval`` of the shipped verifiers plugin against a scripted endpoint. Each adapter's reward is the
grader's for the files the episode left. An adapter test skips when its extra is not installed.

Every kernel of the scripted agent lives in one source (examples/scripted_agent.py), so the whole module builds
one extension."""

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from opforge.harness.env import EnvConfig, EnvError, KernelEnv
from opforge.harness.evaluate import EvalConfig

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agents = _example("scripted_agent")

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


def test_prompt_states_the_kernel_registration_rules(tasks):
    """With RULES.md inlined or not, the prompt says how a kernel is registered and called, and the tools'
    descriptions (what TRL and verifiers show the model) say it too; the task text comes first, then the
    instruction."""
    from opforge.harness.env import instruction, registration_rules

    for include in (True, False):
        env = KernelEnv(tasks, EnvConfig(include_rules=include))
        try:
            prompt = env.reset("scale_relu")
        finally:
            env.close()
        assert prompt.startswith("Task scale_relu") and prompt.index("model.py:") < prompt.index("Tools:")
        for rule in ('#include "registry.h"', "OPFORGE_EXPORT(my_op", "import opforge_kernels", "read_file"):
            assert rule in prompt, (include, rule)
        assert ("What counts as cheating" in prompt) is include
    assert registration_rules() in instruction(EnvConfig(include_rules=False))
    pytest.importorskip("transformers")
    from opforge.harness.adapters.tools import tool_schemas

    schemas = {t["function"]["name"]: t["function"] for t in tool_schemas()}
    assert list(schemas) == ["write_file", "read_file", "list_files", "compile", "verify", "profile", "submit"]
    assert "OPFORGE_EXPORT" in schemas["write_file"]["description"]
    assert "registry.h" in schemas["write_file"]["description"]
    assert "import opforge_kernels" in schemas["write_file"]["description"]
    assert "RULES.md" in schemas["read_file"]["description"]
    assert schemas["write_file"]["parameters"]["required"] == ["path", "content"]


# run in a fresh interpreter with TMPDIR pointed at an empty folder: an environment in this process, one in a child
# process that ends through os._exit (as a trainer's rollout process may: no finalizer, no atexit) and one never
# closed, each with its registry and an episode workspace
_LEAVES_NO_TRACE = """
import os, subprocess, sys
import pandas as pd
sys.path.insert(0, sys.argv[1])
import scripted_agent
from opforge.harness.env import KernelEnv
tasks = pd.DataFrame([scripted_agent.task_row(variants=False)])
child = (f"import os, sys; sys.path.insert(0, {sys.argv[1]!r}); import pandas as pd, scripted_agent; "
         "from opforge.harness.env import KernelEnv; "
         "env = KernelEnv(pd.DataFrame([scripted_agent.task_row(variants=False)])); env.reset('scale_relu'); "
         "assert (env.workspace / 'model.py').is_file(); os._exit(0)")
subprocess.run([sys.executable, "-c", child], check=True)
closed = KernelEnv(tasks)
closed.reset("scale_relu")
closed.close()
kept = KernelEnv(tasks)
kept.reset("scale_relu")
KEPT = [kept, kept._finalizer]  # alive to the end
"""


@pytest.mark.parametrize("keep", [False, True])
def test_environment_folders_leave_no_trace_in_the_temp_dir(tmp_path, keep):
    """No ``opforge-*`` entry is left in the temp dir once the process that used environments exits - also of
    an environment in a child process that ended through ``os._exit`` and of one never closed; with
    ``OPFORGE_KEEP_TMP=1`` they stay, in one session folder (``engine.tempdirs``)."""
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OPFORGE_KEEP_TMP": "1" if keep else "0"}
    proc = subprocess.run([sys.executable, "-c", _LEAVES_NO_TRACE, str(ROOT / "examples")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = sorted(p.name for p in tmp.iterdir() if p.name.startswith("opforge-"))
    if not keep:
        assert left == [], [str(p.relative_to(tmp)) for p in tmp.rglob("*")][:40]
        return
    assert len(left) == 1 and left[0].startswith("opforge-tmp-"), left
    envs = sorted((tmp / left[0]).glob("opforge-env-*/episode-1/workspace/model.py"))
    assert len(envs) == 3, envs  # the child's, the closed one's and the one never closed
    assert "kept temporary folder" in proc.stderr


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


def test_identical_steps_in_flight_at_once_are_graded_once(tasks, build_root):
    """Two environments on one Dask client whose agents submit the same code at the same time share one
    evaluation (its Dask key is the step's content): the same result, to the grader's own seconds; another
    code is graded on its own."""
    import threading

    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=3, processes=False, dashboard_address=None)
    client = Client(cluster)
    envs = [KernelEnv(tasks, CONFIG, client=client, build_root=build_root) for _ in range(3)]
    try:
        kinds = ["honest", "honest", "wrong"]
        for env in envs:
            env.reset("scale_relu")
        threads = [threading.Thread(target=agents.scripted_agent(k), args=(env, "")) for k, env in
                   zip(kinds, envs, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first, second, wrong = (env.result for env in envs)
    finally:
        for env in envs:
            env.close()
        client.close()
        cluster.close()
    assert first["status"] == "correct" and first == second, (first, second)
    assert wrong["status"] == "incorrect" and wrong["eval_s"] != first["eval_s"]


def test_a_dataset_file_keeps_the_hidden_variants(tasks, build_root, tmp_path):
    """A dataset given as a .parquet or .jsonl file (as vf-eval, the OpenEnv server and opforge eval take it)
    keeps every column, the hidden shape_variants above all: the final check of an episode on the file fails
    the kernel that hard-codes the public shape, as on the rows in memory."""
    from opforge.harness.dataset import load_tasks

    parquet, jsonl = tmp_path / "tasks.parquet", tmp_path / "tasks.jsonl"
    tasks.to_parquet(parquet, index=False)
    tasks.to_json(jsonl, orient="records", lines=True)
    for path in (parquet, jsonl):
        loaded = load_tasks(path)
        assert list(loaded.index) == list(tasks["task_id"]), path
        assert list(loaded["shape_variants"]) == list(tasks["shape_variants"]), path
    env = KernelEnv(parquet, CONFIG, build_root=build_root)
    try:
        env.reset("scale_relu")
        for path, text in agents.kernel_files("hardcoded", "cpu", **agents.public_sizes(tasks.iloc[0]["code"])).items():
            env.write_file(path, text)
        text = env.submit()
    finally:
        env.close()
    assert env.result["status"] == "incorrect" and env.reward == -1.0, text
    assert "hidden" in text or "variant" in text, text


@pytest.mark.slow
def test_trl_grpo_step_with_the_environment_and_the_batch_reward(tasks, build_root, tmp_path, monkeypatch):
    """One GRPO step on CPU with a tiny random Qwen2 and a BPE tokenizer built here, twice: with the environment
    (TRL parses the completion's tool calls, runs them on the environment, then asks it for the reward) and
    with the batch reward. Generation is pinned to one added token that holds the whole scripted answer, so
    the rewards are known: the honest files score >= 1 on the task they were written for and -1 on the task
    with other channels."""
    pytest.importorskip("trl")
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


def test_trl_factory_and_reward_pickle_with_a_dask_client(tasks, build_root):
    """AsyncGRPOTrainer pickles its environment factory and reward functions into its rollout process: both
    pickle with a Dask client (as the scheduler's address) and, unpickled, run their heavy steps on that
    scheduler's workers. The task text follows the row's instruction after a blank line."""
    import pickle

    import cloudpickle
    from distributed import Client, LocalCluster
    from opforge.harness.adapters.trl_env import INSTRUCTION, trl_dataset, trl_environment_factory
    from opforge.harness.rl import KernelReward

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    client = Client(cluster)
    env = None
    try:
        factory = trl_environment_factory(tasks, CONFIG, client=client, build_root=build_root)
        reward = KernelReward(tasks, FAST, client=client, build_root=build_root)
        for dumps in (pickle.dumps, cloudpickle.dumps):
            copy = pickle.loads(dumps(reward))
            assert copy.scheduler.address == client.scheduler.address and copy.scheduler.get() is client
            assert copy(["no files here"], task_id=["scale_relu"]) == [-1.0]
        env = pickle.loads(cloudpickle.dumps(factory))()
        assert env.episode.scheduler.get() is client  # this process: the client it was given
        row = trl_dataset(tasks)[0]
        text = env.reset(**row)
        assert text.startswith("\n\nTask scale_relu")
        assert INSTRUCTION + "\n\nTask scale_relu" in row["prompt"][-1]["content"] + text  # what TRL sends
        assert env.compile().startswith("compiled")
        assert "run_step" in cluster.scheduler.task_prefixes  # the step ran on the cluster
    finally:
        if env is not None:
            env.episode.close()
        client.close()
        cluster.close()


@pytest.mark.slow
def test_async_grpo_step_with_the_environment_on_a_dask_cluster(tasks, build_root, tmp_path, monkeypatch):
    """One AsyncGRPOTrainer step on CPU (examples/trl_async_grpo.py): the environment factory travels with a
    Dask client into the spawned rollout process, the rollouts' tool calls run there and their heavy steps on
    the cluster; the rewards the trainer trains and logs with are the grader's, as the scripted policy read them
    from the submit tool of each rollout (the step's group: one honest, one wrong, so the step has a gradient)."""
    for module in ("trl", "aiohttp", "uvicorn", "fastapi"):
        pytest.importorskip(module)
    from distributed import Client, LocalCluster

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.setenv("OPFORGE_CACHE", str(Path(build_root).parent))
    grpo = _example("trl_async_grpo")
    # tcp: the rollout process reaches the scheduler; the workers run in this process
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp://", host="127.0.0.1",
                           dashboard_address=None)
    client = Client(cluster)
    try:
        out = grpo.async_grpo_step(tasks.iloc[:1], tmp_path, client, CONFIG, build_root=build_root,
                                   num_generations=2)
    finally:
        client.close()
        cluster.close()
    log, results, batches = out["log"], out["results"], out["batches"]
    # the step's batch is the first group: the first two rollouts started (a new rollout starts only when one has
    # finished), the policy's first two answers, the honest files and the wrong ones; their rewards are the grader's
    # (-1 incorrect; 1, 2 or 3 correct by its speed-up over eager, which the machine's load moves)
    step = batches[0]
    assert len(step) == 2 and len({s["group"] for s in step}) == 1, (batches, results)
    rewards = sorted(s["reward"] for s in step)
    assert rewards[0] == -1.0 and rewards[1] >= 1.0, (batches, results)
    # every reward the trainer collated is one the submit tool reported to the policy (results holds every finished
    # rollout, and a collated group's rollouts have all finished)
    reported = Counter(r["reward"] for r in results)
    assert not Counter(s["reward"] for b in batches for s in b) - reported, (batches, results)
    assert {"correct", "incorrect"} <= {r["status"] for r in results}, results
    # the logged reward is the mean of the collated batches' means: the data loader collates the next batch before
    # it hands over the step's, so the log also counts a batch the step did not train on
    means = [sum(s["reward"] for s in b) / len(b) for b in batches]
    assert log["rewards/KernelToolEnv"] == pytest.approx(sum(means) / len(means)), (log, batches)
    assert log["tools/call_frequency"] == 3 and log["tools/failure_frequency"] == 0  # write_file x 2, submit
    assert log["batch/samples_per_step"] == 2 and log["grad_norm"] > 0  # rewards differ: a gradient


def test_openenv_directory_server_and_typed_client(tasks, build_root):
    """``openenv validate`` passes on the shipped directory; the server answers requests the environment cannot
    serve with 4xx; an episode through the typed client over /ws ends with the grader's reward for the files it
    wrote (graded again here, outside the environment)."""
    for module in ("openenv", "uvicorn", "fastapi"):
        pytest.importorskip(module)
    import subprocess
    import sys

    from fastapi.testclient import TestClient
    from opforge.harness.adapters.openenv_env import KernelAction, KernelEnvClient, openenv_app
    from opforge.harness.batch import evaluate_one

    proc = subprocess.run([sys.executable, "-m", "openenv.cli", "validate", str(ROOT / "harness" / "opforge_env")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[OK] opforge" in proc.stdout, proc.stdout + proc.stderr

    app = openenv_app(tasks, CONFIG, build_root=build_root)
    http = TestClient(app)
    assert set(http.get("/schema").json()) >= {"action", "observation", "state"}
    assert http.post("/reset", json={}).status_code == 400
    assert http.post("/reset", json={"task_id": "nope"}).status_code == 404
    step = http.post("/step", json={"action": {"tool": "list_files"}})
    assert step.status_code == 409 and "reset" in step.json()["detail"]
    assert http.post("/step", json={"action": {"tool": "rm"}}).status_code == 422

    files = agents.kernel_files("wrong", "cpu", **agents.public_sizes(tasks.iloc[0]["code"]))
    served = _example("scripted_endpoint").Served(app)
    try:
        with KernelEnvClient(base_url=served.url).sync() as env:
            with pytest.raises(RuntimeError, match="no episode"):  # an error message; the session stays open
                env.step(KernelAction(tool="verify"))
            first = env.reset(task_id="scale_relu")
            assert first.observation.text.startswith("Task scale_relu") and not first.done
            assert "OPFORGE_EXPORT" in first.observation.text and "import opforge_kernels" in first.observation.text
            assert "registry.h" in env.step(KernelAction(tool="read_file", path="RULES.md")).observation.text
            for path, text in files.items():
                assert env.step(KernelAction(tool="write_file", path=path, content=text)).observation.text.startswith(
                    "wrote")
            result = env.step(KernelAction(tool="submit"))
            state = env.state()
    finally:
        served.stop()
    graded = evaluate_one(tasks.iloc[0].to_dict(), files, CONFIG.tool_config("submit").model_dump_json(), build_root)
    assert result.done and graded["status"] == "incorrect" and result.reward == graded["reward"] == -1.0
    assert "submit: incorrect" in result.observation.text
    assert state.step_count == 4 and state.reward == -1.0 and state.task_id == "scale_relu"


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


def test_verifiers_plugin_through_vf_eval(tasks, build_root, tmp_path):
    """The shipped plugin loads by its id through verifiers' loader, and ``vf-eval opforge-verifiers`` runs one
    episode against a scripted endpoint (the model: read RULES.md, write the honest files, compile, verify,
    submit): the rollout's reward is the grader's, and the task text is the prompt while the instruction and
    the registration rules are the system prompt."""
    for module in ("verifiers", "uvicorn", "fastapi"):
        pytest.importorskip(module)
    import shutil
    import subprocess
    import sys

    from opforge.harness.adapters.verifiers_env import KernelHarness, KernelTaskset, KernelVerifiersEnv
    from verifiers.v1.utils.loaders import environment_class, harness_class, taskset_class

    assert taskset_class("opforge-verifiers") is KernelTaskset
    assert environment_class("opforge-verifiers") is KernelVerifiersEnv
    assert harness_class("opforge-verifiers") is KernelHarness
    path = tmp_path / "tasks.parquet"
    tasks.iloc[:1].to_parquet(path, index=False)
    endpoint = _example("scripted_endpoint")
    app = endpoint.scripted_app(endpoint.chat_script("honest"))
    served = endpoint.Served(app)
    vf_eval = shutil.which("vf-eval") or str(Path(sys.executable).with_name("vf-eval"))
    cmd = [vf_eval, "opforge-verifiers", "--env.taskset.dataset", str(path), "--env.taskset.build-root", build_root,
           "--env.taskset.include-rules", "false", "--env.taskset.final.timing-trials", "3",
           "--env.taskset.final.warmup", "1", "--env.taskset.final.profile-compile", "false",
           "--model", "scripted", "--client.base-url", f"{served.url}/v1", "--no-push", "--no-rich", "-n", "1",
           "-o", str(tmp_path / "vf")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                              env={**os.environ, "OPFORGE_CACHE": str(Path(build_root).parent)})
    finally:
        served.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    trace = json.loads(proc.stdout)
    reward, result = trace["rewards"]["kernel_reward"]["score"], trace["info"]["kernel_result"]
    assert trace["ok"] and result["status"] == "correct" and reward == result["reward"] >= 1.0, trace["info"]
    texts = app.state.tool_texts  # what the tools answered, in order, up to submit (which ends the episode)
    assert len(texts) == 5 and "OPFORGE_EXPORT" in texts[0] and texts[1].startswith("wrote")
    assert texts[3].startswith("compiled") and texts[4].startswith("verify: correct")
    data = trace["task"]["data"]
    assert data["prompt"].startswith("Task scale_relu") and tasks.iloc[0]["code"] in data["prompt"]
    assert "OPFORGE_EXPORT" not in data["prompt"] and "OPFORGE_EXPORT" in data["system_prompt"]
