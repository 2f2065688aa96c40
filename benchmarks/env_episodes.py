"""Parallel episodes of the trainer-facing environment (harness/env.py) with a scripted agent: episodes per
minute and the reward distribution.

    python benchmarks/env_episodes.py --device cuda --episodes 64      # -> results/<machine>/env_episodes.json

Each episode is one ``KernelEnv`` driven by the scripted agent of examples/scripted_agent.py (read model.py,
write the kernel and model_new.py, compile, verify, [profile,] submit) in a thread of this process; every
compile / verify / profile / submit runs on the Dask cluster's GPU worker (``engine.cluster.open_cluster``,
``--workers`` evaluations at once per GPU), the way a trainer's rollouts would. The agents are mixed
``--mix`` (default half honest, a quarter that hard-code the public shape, a quarter wrong), over ``--tasks``
public sizes of the task (so as many kernels are built, each shared by its episodes). The expected rewards:
honest >= 1 (2 or 3 when faster than eager / ``torch.compile``), hard-coded and wrong -1.

Writes ``results/<machine>/env_episodes.json`` through ``record.py`` (``--out FILE``: a scratch copy there
instead; each episode is also appended to ``<out>.partial.jsonl`` as it ends): the settings, the device, ``summary`` (``harness.episodes.episode_summary``: episodes,
episodes/min over the wall time of all episodes, reward counts, statuses, mean reward per agent, medians of
turns and episode seconds) and one short record per episode. The wall time includes the builds (one per public
size) and the cluster's start is excluded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# public sizes (batch_size, seq_len, channels) of the task: real hidden sizes and sequence lengths, eager times
# of roughly 0.1-2 ms on an H200 (three elementwise passes over the input); CPU: small ones
GPU_SIZES = [(32, 512, 4096), (16, 1024, 2048), (64, 197, 768), (8, 2048, 5120)]
CPU_SIZES = [(16, 32, 64), (8, 64, 32), (4, 16, 128), (2, 128, 64)]


def _agents_module():
    spec = importlib.util.spec_from_file_location("scripted_agent", ROOT / "examples" / "scripted_agent.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mix(text: str) -> list[tuple[str, float]]:
    out = []
    for part in text.split(","):
        name, _, share = part.partition(":")
        out.append((name.strip(), float(share)))
    return out


def plan(episodes: int, mix: list[tuple[str, float]], n_tasks: int) -> list[tuple[str, int]]:
    """(agent kind, task index) per episode: kinds in proportion to ``mix`` (largest remainders), tasks round
    robin within each kind."""
    total = sum(s for _, s in mix)
    counts = {k: int(episodes * s / total) for k, s in mix}
    rest = sorted(mix, key=lambda ks: -(episodes * ks[1] / total - counts[ks[0]]))
    for k, _ in rest[: episodes - sum(counts.values())]:
        counts[k] += 1
    return [(k, i % n_tasks) for k, _ in mix for i in range(counts[k])]


def build_seconds(compiles: list[dict]) -> dict:
    """Seconds of each build that compiled (one per distinct solution; the others came from the cache) and
    their median, from the compile tool's history entries (``build_s``, ``build_cached``)."""
    import statistics

    built = sorted(round(c["build_s"], 2) for c in compiles if c.get("build_s") and not c.get("build_cached"))
    return {"compiles": len(compiles), "built": len(built), "build_s": built,
            "build_s_p50": statistics.median(built) if built else None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=64, help="episodes at once (agent threads)")
    ap.add_argument("--workers", type=int, default=None,
                    help="evaluations at once per GPU (default: engine.cluster.default_workers, 14 on 16 cores)")
    ap.add_argument("--tasks", type=int, default=4, help="public sizes of the task (<= 4)")
    ap.add_argument("--mix", default="honest:0.5,hardcoded:0.25,wrong:0.25")
    ap.add_argument("--profile", action="store_true", help="the agent also calls profile() before submit()")
    ap.add_argument("--timing-trials", type=int, default=20, help="timed rounds of submit")
    ap.add_argument("--build-root", default=None, help="extension build cache (default $OPFORGE_CACHE/extensions)")
    ap.add_argument("--out", type=Path, default=None, help="write a scratch copy here instead of results/")
    args = ap.parse_args(argv)

    import pandas as pd
    from opforge.engine.cluster import default_workers, open_cluster
    from opforge.harness.env import EnvConfig
    from opforge.harness.episodes import episode_summary, run_episodes
    from opforge.harness.evaluate import EvalConfig

    agents = _agents_module()
    sizes = (GPU_SIZES if args.device == "cuda" else CPU_SIZES)[: max(1, min(4, args.tasks))]
    rows = [agents.task_row(f"scale_relu_{b}x{n}x{c}", b, n, c) for b, n, c in sizes]
    tasks = pd.DataFrame(rows)
    episodes = plan(args.episodes, _mix(args.mix), len(rows))
    kinds = [k for k, _ in episodes]
    task_ids = [rows[i]["task_id"] for _, i in episodes]
    final = EvalConfig(device=args.device, timing_trials=args.timing_trials,
                       profile_compile=args.device == "cuda")
    config = EnvConfig(device=args.device, final=final, include_rules=False)
    workers = args.workers or default_workers(args.device)
    handle = open_cluster(args.device, workers)
    # each episode as it ends, so a run cut by a time limit still shows what finished and when
    partial = (Path(args.out) if args.out else Path(tempfile.gettempdir()) / "env_episodes").with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")

    def keep(i: int, r: dict) -> None:
        with open(partial, "a") as fh:
            fh.write(json.dumps({"episode": i, "at_s": round(time.perf_counter() - t0, 2),
                                 **{k: r[k] for k in ("task_id", "agent", "reward", "status", "turns", "seconds")}})
                     + "\n")

    try:
        t0 = time.perf_counter()
        results = run_episodes([agents.scripted_agent(k, args.device, args.profile) for k in kinds], task_ids,
                               tasks, config, client=handle.client, parallel=args.parallel,
                               build_root=args.build_root, progress=sys.stderr.isatty(), on_result=keep)
        seconds = time.perf_counter() - t0
        description = handle.description
    finally:
        handle.close()
    gpu = None
    if args.device == "cuda":
        from opforge.engine.ledger import gpu_names

        gpu = (gpu_names() or [None])[0]
    out = {
        "benchmark": "env_episodes", "device": args.device, "gpu": gpu, "cluster": description,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "tasks": [{"task_id": r["task_id"], "variants": json.loads(r["shape_variants"])} for r in rows],
        "summary": episode_summary(results, seconds),
        "builds": build_seconds([t for r in results for t in r["tools"] if t["tool"] == "compile"]),
        "episodes": [{k: r[k] for k in ("task_id", "agent", "reward", "status", "turns", "seconds", "error")}
                     | {"tool_seconds": {t["tool"]: t["seconds"] for t in r["tools"]}} for r in results],
    }
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import record

    path = record.write_file(args.out, out) if args.out else record.write("env_episodes", out)
    print(json.dumps({**out["summary"], "builds": out["builds"]}, indent=1))
    print(f"result: {path}")
    return out


if __name__ == "__main__":
    main()
