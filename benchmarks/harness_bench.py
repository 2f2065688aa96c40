"""Harness on a GPU: hand-written CUDA solutions and reward throughput; on CPU, the batch and the grader.

    python benchmarks/harness_bench.py [--batch 64] [--workers 8]          # -> results/<gpu>/harness_solutions.json
    python benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16   # -> results/<gpu>/harness_batch.json
    python benchmarks/harness_bench.py --device cpu --workers 2            # -> results/cpu-<N>core/harness_batch.json
    python benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16 --steps 2  # and a trainer's next step

With ``--device cpu`` the task and solutions are those of ``tests/harness_cases.py`` (a small task with a
C++ extension and cheats of the same kinds), so the batch measurement runs on any machine. Two
measurements of the grader itself (``--overhead`` on CPU only):

    python benchmarks/harness_bench.py --device cpu --overhead 5          # -> harness_overhead.json
    python benchmarks/harness_bench.py --device cpu --consistency 5 --batch 16   # -> harness_consistency.json
    python benchmarks/harness_bench.py --consistency 5 --batch 16 --workers 16   # the same on CUDA
    python benchmarks/harness_bench.py --consistency 5 --batch 16 --workers 16 --case scale_relu  # near eager

``--overhead N``: the honest solution evaluated N times in a row (build cached): wall seconds per
evaluation and the verify / profile parts (run it once per code version for a before / after).
``--consistency R``: ``opforge eval`` (the CLI, its default local cluster) R times on the honest solution
alone and R times on ``--batch`` copies of it (one task id each, same code): reward and speed-up per
evaluation, so a reward that depends on the batch shows.

1. Each solution under ``benchmarks/harness_solutions/<task_id>/`` (tasks in ``tasks.jsonl`` there: fused
   tasks composed by opforge and accepted by its filters on an H200) is evaluated with
   ``harness.evaluate`` on CUDA: status, reward, eager / compile / candidate ms and speed-ups.
2. A batch of ``--batch`` completions (honest solutions and cheats of several kinds, cycled over the
   tasks) is scored with ``harness.rl.KernelReward`` on a Dask cluster with one GPU worker and
   ``--workers`` evaluation threads; reports rewards per minute, build seconds (one build per distinct
   source, then cached) and verification / profiling seconds, and checks every cheat got -1. The reward's
   ``prepare()`` (the workers' fork servers, a trainer's one-time set-up) runs before the first batch, outside its
   wall (``batch.prepare``; ``--no-prepare``: inside it). With ``--steps N``
   N such batches are scored one after the other on the same cluster, as a trainer's steps: the first pays the
   machine's start (Dask workers, fork servers); each later one has new content (every completion built and graded
   again) and empty compile caches (every reference compiled again), and is summarised under ``steps``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import record
from opforge.harness.dataset import get_task, load_tasks
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.solution import Solution, format_completion

ROOT = Path(__file__).resolve().parent / "harness_solutions"

# cheats for a one-input elementwise task ``forward(self, x)``: model_new.py bodies
CHEAT_BODIES = {
    "torch_ops": "        return torch.sigmoid(x) * x\n",
    "zeros": "        return torch.zeros_like(x)\n",
    "returns_input": "        return x\n",
}


def _cheat(body: str) -> dict[str, str]:
    return {"model_new.py": "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                            "    def __init__(self):\n        super().__init__()\n\n    def forward(self, x):\n" + body}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="result name, benchmarks/results/<machine>/NAME.json (default by mode: "
                                   "harness_solutions, harness_batch, harness_overhead, harness_consistency)")
    p.add_argument("--out", help="write the result JSON here instead")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--no-prepare", action="store_true",
                   help="score the first batch without KernelReward.prepare() first (it then starts the fork servers)")
    p.add_argument("--steps", type=int, default=1,
                   help="batches scored one after the other on the same cluster (a trainer's steps): each later "
                        "one with new content and empty compile caches (see score_batch)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--skip-solutions", action="store_true", help="only the batch (step 2)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="plain bursts (EvalConfig.cuda_graphs off)")
    p.add_argument("--overhead", type=int, default=0, help="CPU: evaluations of the honest solution in a row")
    p.add_argument("--consistency", type=int, default=0, help="repeats of alone vs batch (opforge harness eval)")
    p.add_argument("--case", choices=["harness", "scale_relu"], default="harness",
                   help="--consistency on CUDA: a harness_solutions kernel or the scripted agent's honest kernel")
    p.add_argument("--task", default=None, help="--case harness: the task id of harness_solutions/ (default the first)")
    p.add_argument("--size", default="16x1024x2048", help="--case scale_relu: batch x seq_len x channels")
    args = p.parse_args()
    args.name = args.name or ("harness_overhead" if args.device == "cpu" and args.overhead else
                              "harness_consistency" if args.consistency else
                              "harness_batch" if args.device == "cpu" or args.skip_solutions else "harness_solutions")
    if args.device == "cpu" and args.overhead:
        return cpu_overhead(args)
    if args.consistency:
        return consistency(args)
    if args.device == "cpu":
        return cpu_batch(args)
    tasks = load_tasks(ROOT / "tasks.jsonl")
    build_root = tempfile.mkdtemp(prefix="opforge-ext-")
    config = EvalConfig(device="cuda", cuda_graphs=not args.no_cuda_graphs)
    out: dict = {"solutions": {}}
    for tid in [] if args.skip_solutions else tasks.index:
        t0 = time.perf_counter()
        res = evaluate(get_task(tasks, tid), Solution.from_dir(ROOT / tid), config, build_root=build_root)
        out["solutions"][tid] = {**{k: getattr(res, k) for k in (
            "status", "reward", "hacks", "error", "max_error", "eager_ms", "compile_ms", "candidate_ms",
            "speedup_eager", "speedup_compile", "build_s", "verify_s", "profile_s", "eval_s")},
            "ops": tasks.loc[tid, "ops"], "wall_s": time.perf_counter() - t0}
        print(tid, json.dumps(out["solutions"][tid]), flush=True)
        _save(args, out)  # kept if the batch is cut off

    kinds = ["honest", *CHEAT_BODIES]
    solutions, ids, expect = [], [], []
    for i in range(args.batch):
        tid, kind = tasks.index[i % len(tasks)], kinds[(i // len(tasks)) % len(kinds)]
        solutions.append(Solution.from_dir(ROOT / tid).files if kind == "honest" else _cheat(CHEAT_BODIES[kind]))
        ids.append(tid)
        expect.append(kind)
    out["cuda_graphs"] = config.cuda_graphs
    out["batch"], out["steps"] = score_batch(ROOT / "tasks.jsonl", solutions, ids, expect, config, "cuda",
                                             args.workers, args.steps, not args.no_prepare)
    _save(args, out)


def _save(args, payload: dict) -> Path:
    """The result so far, through ``record`` (rewritten as the run goes, so a cut-off run keeps its part)."""
    return record.write_file(args.out, payload) if args.out else record.write(args.name, payload)


def _stamped(files: dict[str, str], step: int) -> dict[str, str]:
    """``files`` with a comment naming ``step`` at the end of each: new content (a new build and evaluation), the
    same program."""
    return {n: t + ("\n# step %d\n" if n.endswith(".py") else "\n// step %d\n") % step for n, t in files.items()}


def _clear_compile_caches() -> None:
    """Remove Inductor's and Triton's on-disk caches (their default folders), so that the next step compiles its
    references from scratch, as a trainer's next step with new tasks does."""
    import shutil

    from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

    for folder in (cache_dir(), triton_cache_dir(0)):
        shutil.rmtree(folder, ignore_errors=True)


def score_batch(dataset, solutions, ids, expect, config, device: str, workers: int, steps: int = 1,
                prepare: bool = True) -> tuple[dict, list[dict]]:
    """Score ``steps`` batches one after the other with one ``KernelReward`` on one fresh cluster, as a trainer's
    steps: the first is ``solutions``, each later one the same solutions with new content (``_stamped``: every
    one built and evaluated again) after the compile caches were removed (``_clear_compile_caches``). With
    ``prepare`` the reward's ``prepare()`` (the workers' fork servers) runs first, as a trainer's set-up, outside
    the batches' walls (its seconds are in the first step's ``prepare``). Returns the first step's timings in full
    and every step's summary."""
    from opforge.engine.cluster import open_cluster
    from opforge.harness.rl import KernelReward

    handle = open_cluster(device, workers=workers)
    summaries, first, prepared = [], None, None
    try:
        fn = KernelReward(dataset, config, client=handle.client, build_root=tempfile.mkdtemp(prefix="opforge-ext-"))
        if prepare:
            t0 = time.perf_counter()
            prepared = {"workers": fn.prepare(), "seconds": round(time.perf_counter() - t0, 3)}
        for step in range(steps):
            if step:
                _clear_compile_caches()
            completions = [format_completion(_stamped(f, step) if step else f) for f in solutions]
            t0 = time.perf_counter()
            rewards = fn(completions, task_id=ids)
            wall = time.perf_counter() - t0
            batch = _batch_summary(fn.last_results, rewards, completions, ids, expect, device, workers, wall)
            first = first or {**batch, "prepare": prepared}
            summaries.append({"step": step, **{k: batch[k] for k in (
                "wall_s", "rewards_per_min", "build_s_p50", "phases_median_s", "status", "cheats_all_minus_one",
                "honest_rewards")}})
    finally:
        handle.close()
    return first, summaries


def _batch_summary(res, rewards, completions, ids, expect, device, workers, wall) -> dict:
    batch = {
        "size": len(completions), "device": device, "workers": workers, "wall_s": wall,
        # KernelReward grades each distinct (task, completion) once and gives its copies the same reward
        "distinct": len(set(zip(ids, completions, strict=True))),
        "rewards_per_min": 60 * len(completions) / wall,
        "build_s_total": sum(r["build_s"] for r in res), "builds": sum(1 for r in res if r["build_s"] > 0),
        # one build per distinct solution (the others wait for it and get the cached module: 0 s)
        "build_s_per_solution": sorted(round(r["build_s"], 2) for r in res if r["build_s"] > 0),
        "build_s_p50": statistics.median([r["build_s"] for r in res if r["build_s"] > 0] or [0.0]),
        "verify_s_total": sum(r.get("verify_s") or 0 for r in res),
        "profile_s_total": sum(r.get("profile_s") or 0 for r in res),
        "eval_child_s_total": sum(r.get("eval_s") or 0 for r in res),
        # median seconds of the grader's steps over the batch (EvalResult.phases_s: admit, setup, rounds, draw, teardown, total)
        "phases_median_s": {k: statistics.median(r["phases_s"][k] for r in res if k in (r.get("phases_s") or {}))
                            for k in sorted({k for r in res for k in (r.get("phases_s") or {})})},
        # evaluations whose reference server was kept from an earlier one (harness.warm), of those that got one
        "warm_references": sum(1 for r in res if r.get("warm_reference")),
        "graded": sum(1 for r in res if r.get("phases_s")),
        "cheats_all_minus_one": all(r == -1 for r, k in zip(rewards, expect, strict=True) if k != "honest"),
        "honest_rewards": [r for r, k in zip(rewards, expect, strict=True) if k == "honest"],
        "status": {s: sum(1 for r in res if r["status"] == s) for s in {r["status"] for r in res}},
        "honest_errors": sorted({str(r.get("error"))[:400] for r, k in zip(res, expect, strict=True)
                                 if k == "honest" and r["status"] != "correct"}),
        # each distinct evaluation: its kind, status, build and grading seconds and the grader's steps
        "evaluations": [{"task": t, "kind": k, "status": r["status"], "build_s": round(r["build_s"], 2),
                         "eval_s": round(r.get("eval_s") or 0.0, 2), "phases_s": r.get("phases_s") or {},
                         "warm_reference": bool(r.get("warm_reference"))}
                        for (t, c), (r, k) in {(t, c): (r, k) for t, c, r, k in
                                               zip(ids, completions, res, expect, strict=True)}.items()],
    }
    print(json.dumps(batch), flush=True)
    return batch


def cpu_batch(args) -> None:
    """The batch measurement on CPU with the test suite's task, honest C++ solution and cheats."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.harness_cases import CHEATS, HONEST, TASK

    work = Path(tempfile.mkdtemp(prefix="opforge-harness-bench-"))
    (work / "tasks.jsonl").write_text(json.dumps({"task_id": "scale_relu", "code": TASK,
                                                  "data_source": "torch#2"}) + "\n")
    kinds = {"honest": HONEST, "torch_ops": CHEATS["torch_relu"], "zeros": CHEATS["all_zeros"],
             "returns_input": CHEATS["returns_input"]}
    names = list(kinds)
    expect = [names[i % len(names)] for i in range(args.batch)]
    config = EvalConfig(device="cpu", timing_trials=10)
    batch, steps = score_batch(work / "tasks.jsonl", [kinds[k] for k in expect], ["scale_relu"] * args.batch, expect,
                               config, "cpu", args.workers, args.steps, not args.no_prepare)
    _save(args, {"batch": batch, "steps": steps})


def _cases():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import harness_cases

    return harness_cases


def cpu_overhead(args) -> None:
    """Per-evaluation cost of the honest solution on CPU (first evaluation builds; the rest are cached)."""
    cases = _cases()
    row = {"task_id": "scale_relu", "code": cases.TASK, "data_source": "torch#2"}
    build_root = tempfile.mkdtemp(prefix="opforge-ext-")
    config = EvalConfig(device="cpu", profile_compile=False, timing_trials=20)
    runs = []
    for i in range(args.overhead + 1):
        t0 = time.perf_counter()
        res = evaluate(row, Solution(cases.HONEST), config, build_root=build_root)
        runs.append({"wall_s": time.perf_counter() - t0, "status": res.status, "reward": res.reward,
                     "build_s": res.build_s, "verify_s": res.verify_s, "profile_s": res.profile_s,
                     "eager_ms": res.eager_ms, "candidate_ms": res.candidate_ms})
        print(i, json.dumps(runs[-1]), flush=True)
    cached = runs[1:]
    out = {"runs": runs, "median_wall_s_cached": sorted(r["wall_s"] for r in cached)[len(cached) // 2],
           "config": config.model_dump(mode="json")}
    _save(args, out)


def _consistency_case(args) -> tuple[str, str, dict[str, str], list[str], dict | None]:
    """(task code, data source, solution files, extra CLI args, task row extras) of ``--case``."""
    if args.device == "cpu":
        cases = _cases()
        return cases.TASK, "torch#2", cases.HONEST, ["--no-compile"], None
    extra = ["--device", "cuda", "--workers", str(args.workers)]
    if args.case == "harness":
        tasks = load_tasks(ROOT / "tasks.jsonl")
        tid = args.task or tasks.index[0]
        if tid not in tasks.index:
            raise SystemExit(f"--task {tid!r}: not in {ROOT / 'tasks.jsonl'} ({', '.join(tasks.index)})")
        return tasks.loc[tid, "code"], tasks.loc[tid, "data_source"], Solution.from_dir(ROOT / tid).files, extra, None
    import importlib.util

    spec = importlib.util.spec_from_file_location("scripted_agent", ROOT.parents[1] / "examples" / "scripted_agent.py")
    agents = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agents)
    b, n, c = (int(v) for v in args.size.split("x"))
    row = agents.task_row(f"scale_relu_{b}x{n}x{c}", b, n, c)
    files = agents.kernel_files("honest", "cuda", b, n, c)
    return row["code"], row["data_source"], files, extra, {k: row[k] for k in ("size_context", "shape_variants",
                                                                                  "dtype")}


def consistency(args) -> None:
    """Reward of one honest solution alone and in a batch of ``args.batch`` through ``opforge harness eval``
    (its default local cluster; ``--workers`` evaluations at once on CUDA). CPU: the test suite's task and C++
    solution, ``--no-compile``. CUDA, with the ``torch.compile`` baseline: ``--case harness``, a task of
    ``harness_solutions/`` (``--task``, default the first) and its hand-written kernel (about 2x eager, near
    ``torch.compile``); ``--case scale_relu``: the scripted agent's honest kernel of examples/scripted_agent.py
    at ``--size`` (near eager's speed, so its reward sits on the 1.05 threshold). Every copy has its own task
    id and the same code and solution. Each repeat is saved as it ends; with ``--out`` an existing file of the
    same settings is resumed (its finished repeats kept)."""
    import shutil
    import subprocess
    import sys

    work = Path(tempfile.mkdtemp(prefix="opforge-consistency-"))
    code, source, files, extra, row_extra = _consistency_case(args)
    rows = [{"task_id": f"honest_{i:02d}", "code": code, "data_source": source, **(row_extra or {})}
            for i in range(args.batch)]
    (work / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for n, name in ((1, "alone"), (args.batch, "batch")):
        for r in rows[:n]:
            Solution(files).write_to(work / name / r["task_id"])
    settings = {"device": args.device, "case": args.case if args.device == "cuda" else "cpu",
                "task": args.task if args.case == "harness" else args.size, "batch_size": args.batch,
                "extra_args": extra}
    out: dict = {**settings, "alone": [], "batch": []}
    if args.out and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        if all(old.get(k) == v for k, v in settings.items()):
            out.update(alone=old.get("alone", []), batch=old.get("batch", []))
            print(f"resuming: {len(out['alone'])} alone, {len(out['batch'])} batch repeats done", flush=True)
    keys = ("reward", "status", "speedup_eager", "speedup_compile", "eager_ms", "compile_ms", "candidate_ms",
            "overhead_ms")
    for rep in range(args.consistency):
        for name in ("alone", "batch"):
            if len(out[name]) > rep:
                continue
            report = work / f"report_{name}_{rep}"
            shutil.rmtree(report, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "opforge.pipeline.cli", "harness", "eval", str(work / "tasks.jsonl"),
                            str(work / name), str(report), *extra, "--quiet"], check=True, capture_output=True)
            res = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
            out[name].append({"wall_s": time.perf_counter() - t0, "rewards": [r["reward"] for r in res],
                              "speedups": [r.get("speedup_eager") for r in res],
                              "speedups_compile": [r.get("speedup_compile") for r in res],
                              "eager_ms": [r.get("eager_ms") for r in res],
                              "status": sorted({r["status"] for r in res}),
                              "evaluations": [{k: r.get(k) for k in keys} | {"timing": r.get("timing")}
                                              for r in res]})
            print(name, rep, json.dumps({k: v for k, v in out[name][-1].items() if k != "evaluations"}), flush=True)
            rewards = [x for key in ("alone", "batch") for r in out[key] for x in r["rewards"]]
            out["reward_range"] = [min(rewards), max(rewards)]
            _save(args, out)


if __name__ == "__main__":
    main()
