"""The streamed main job on CPU: composer shards as Dask tasks (the same rows on 1 and 4 workers), the filter
fed shard by shard (the verdicts of a one-shot filter over the same candidates), a run killed in the middle
of a streamed round resumes to the same verdicts, the next round fed to the filter while a round ends gives
the run of rounds filtered one after the other, and the stage timeline in run.json."""

import json

import pandas as pd
import pytest
from opforge.compose.composer import ComposeConfig, compose, composer_pool, rows_frame
from opforge.engine.cluster import open_cluster
from opforge.pipeline import compose_tasks, filter_run
from opforge.pipeline.compose_tasks import PLUGIN_NAME, compose_shard, composer_files, shards_of_round
from opforge.pipeline.filter_run import FilterStream, run_filter
from opforge.pipeline.run import (
    _compose_options,
    _filter_settings,
    _StreamedJob,
    compose_rounds,
    run_pipeline,
)
from opforge.pipeline.run_config import ConfigError, RunConfig
from opforge.pipeline.status import format_status, run_status
from opforge.seeds.catalog import read_catalog

# Filters whose verdicts do not depend on timings (so two runs must agree), and cheap on one core.
SKIP = ["compile", "contamination", "determinism", "runtime", "runtime_screen", "trivial", "headroom"]
VERDICT = ["row", "task_id", "accepted", "reason", "filter"]


@pytest.fixture(scope="module")
def cluster():
    handle = open_cluster("cpu", workers=1, cpu_workers=4)
    yield handle
    handle.close()


def _cfg(out, catalog_path, **kw) -> RunConfig:
    return RunConfig(target=4, out=out, device="cpu", seed=3, seeds_catalog=catalog_path, device_profile="test",
                     round_size=12, timeout_s=60, skip_filters=SKIP, transformers_share=0.0, motif_share=0.0, **kw)


def test_shards_are_the_same_rows_on_one_and_four_workers(cluster, catalog_path, harvested):
    cfg = _cfg("unused", catalog_path).resolved()
    cluster.client.register_plugin(composer_files(catalog_path, None, None), name=PLUGIN_NAME)
    options = _compose_options(cfg)
    shards = shards_of_round(1, 12, shard_size=4)
    assert shards == [(12, 4), (16, 4), (20, 4)]

    def rows(workers):
        futures = [cluster.client.submit(compose_shard, options, start, n, workers=workers, pure=False)
                   for start, n in shards]
        out = [f.result() for f in futures]
        return [r for o in out for r in o["rows"]], {o["worker"] for o in out}

    four, used = rows(cluster.cpu_workers)
    one, used_one = rows(cluster.cpu_workers[:1])
    assert len(used_one) == 1 and len(cluster.cpu_workers) == 4
    assert four == one
    # the one-shot composition in fresh processes, as the shards' workers compose; one pool serves several
    # index ranges (`opforge run --compose-rounds`), and only its own catalog and config
    with composer_pool(harvested.ops, ComposeConfig(**options, n=12), 2) as pool:
        whole = compose(harvested.ops, ComposeConfig(**options, n=12, start_index=12), progress=False, pool=pool)
        first = compose(harvested.ops, ComposeConfig(**options, n=12, start_index=0), progress=False, pool=pool)
        with pytest.raises(ValueError, match="another catalog or composer config"):
            compose(harvested.ops, ComposeConfig(**{**options, "seed": options["seed"] + 1}, n=4), pool=pool)
    assert pd.DataFrame([r for r in four if r]).equals(whole)
    assert first.equals(compose(harvested.ops, ComposeConfig(**options, n=12, start_index=0), progress=False))


def test_rounds_composed_ahead_are_the_rounds_a_run_streams(cluster, catalog_path, tmp_path):
    """`opforge run --compose-rounds N` (no cluster) writes the round files the streamed run composes, keeps
    finished rounds, and refuses a run directory of another run."""
    cfg = _cfg(tmp_path / "run", catalog_path).model_copy(update={"motif_share": 0.5})
    paths = compose_rounds(cfg, 2, workers=2, progress=False)
    assert [p.name for p in paths] == ["round-0000.parquet", "round-0001.parquet"]
    cluster.client.register_plugin(composer_files(catalog_path, None, None), name=PLUGIN_NAME)
    options = _compose_options(cfg.resolved())
    futures = [cluster.client.submit(compose_shard, options, start, n, pure=False)
               for start, n in shards_of_round(1, 12)]
    streamed = rows_frame([r for f in futures for r in f.result()["rows"]])
    assert len(streamed) > 0 and pd.read_parquet(paths[1]).equals(streamed)
    stamp = paths[0].stat().st_mtime_ns
    again = compose_rounds(cfg, 3, workers=1, progress=False)
    assert paths[0].stat().st_mtime_ns == stamp and again[2].exists()
    with pytest.raises(ConfigError, match="seed"):
        compose_rounds(cfg.model_copy(update={"seed": 4}), 1)
    with pytest.raises(ConfigError, match="at least 1"):
        compose_rounds(cfg, 0)
    # a round another composer version made is never filtered in place of this composer's
    stale = pd.read_parquet(paths[1]).assign(generator="opforge-compose/0.1")
    stale.to_parquet(paths[1], index=False)
    for call in (lambda: compose_rounds(cfg, 3, workers=1, progress=False),
                 lambda: run_pipeline(cfg, progress=False)):
        with pytest.raises(ConfigError, match="round-0001.parquet: composed by opforge-compose/0.1"):
            call()


def test_killed_stream_resumes_to_the_verdicts_of_a_one_shot_filter(cluster, catalog_path, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(compose_tasks, "SHARD_SIZE", 4)  # three shards per round: the filter starts on the first
    address = cluster.client.scheduler.address
    out = tmp_path / "run"
    original = FilterStream.add

    def killed_at_the_second_shard(self, rows):
        if self.rows:  # the first shard is in the filter: let two verdicts land, then die
            while self.verdicted < 2 and self.step():
                pass
            raise KeyboardInterrupt("killed while streaming")
        return original(self, rows)

    monkeypatch.setattr(FilterStream, "add", killed_at_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(_cfg(out, catalog_path, scheduler=address), progress=False)
    ledger = out / "filter" / "ledger.jsonl"
    assert len(ledger.read_text().splitlines()) >= 2
    assert not (out / "candidates" / "round-0000.parquet").exists() and not (out / "run.json").exists()
    monkeypatch.setattr(FilterStream, "add", original)

    res = run_pipeline(_cfg(out, catalog_path, scheduler=address), progress=False)
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert len(lines) == len({x["task_id"] for x in lines})  # nothing verdicted twice
    # the same candidates as composing the rounds at once, the same verdicts as one filter pass over them
    cands = pd.read_parquet(out / "candidates.parquet")
    cfg = _cfg(out, catalog_path).resolved()
    options = _compose_options(cfg)
    n_rounds = len(list((out / "candidates").glob("round-*.parquet")))
    rounds = [compose(read_catalog(catalog_path), ComposeConfig(**options, n=12, start_index=12 * k), progress=False)
              for k in range(n_rounds)]
    pd.testing.assert_frame_equal(cands, pd.concat(rounds, ignore_index=True))
    joined = open_cluster("cpu", scheduler=address)
    try:
        one_shot = run_filter(out / "candidates.parquet", tmp_path / "one-shot", _filter_settings(cfg),
                              progress=False, handle=joined)
    finally:
        joined.close()
    streamed = pd.read_parquet(out / "filter" / "verdicts.parquet")
    pd.testing.assert_frame_equal(streamed[VERDICT], one_shot.verdicts[VERDICT])
    assert res.selected == cfg.target
    run = json.loads((out / "run.json").read_text())
    stages = run["timeline"]["stages"]
    assert {"harvest", "cluster_start", "compose", "filter", "select_and_publish"} <= set(stages)
    assert stages["filter"]["start"] <= stages["filter"]["end"] and stages["filter"]["busy_s"] > 0
    assert "timeline" in format_status(run_status(out))
    # the client's seconds per round: every round of the run, its wait for verdicts inside its result phase
    rounds = run["timeline"]["client_rounds"]
    assert sorted(rounds) == [str(k) for k in range(run["rounds"])]
    for r in rounds.values():
        assert set(r) == {"pieces_s", "result_s", "waiting_s", "select_s"}
        assert 0 <= r["waiting_s"] <= r["result_s"] + 0.01 and min(r.values()) >= 0
    # the publication's steps: every published row's variants read from the cache or computed now
    steps = run["publication_steps"]
    assert steps["variants_cached"] + steps["variants_computed"] == res.selected
    assert min(v for k, v in steps.items() if k.endswith("_s")) >= 0
    assert "after the last verdict: cluster closed in" in format_status(run_status(out))
    # the cluster closes beside the publication, and the run ends when both have
    close, publish = stages["cluster_close"], stages["select_and_publish"]
    assert stages["filter"]["end"] <= close["start"] <= publish["start"] and close["start"] <= close["end"]
    assert run["timeline"]["end"] >= max(close["end"], publish["end"]) - 0.01
    assert steps["filter_close_s"] <= steps["cluster_close_s"]



def test_large_batches_are_fingerprinted_on_the_cpu_workers_as_on_the_client(cluster, monkeypatch):
    """``prefill_fingerprints``: a batch with enough uncached sources is fingerprinted in chunks on the CPU
    workers and cached; each cached fingerprint equals the client's own; small batches, cached sources and a
    cluster without CPU workers leave the work to the client."""
    from opforge.filters.duplicate import fingerprint
    from opforge.pipeline import filter_run

    src = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
           "        return torch.{op}(x) * {c}\n\n\ndef get_inputs():\n    return [torch.randn(8, {n})]\n\n\n"
           "def get_init_inputs():\n    return []\n")
    codes = [src.format(op=op, c=c, n=n) for op in ("relu", "sigmoid", "tanh") for c in (2, 3) for n in range(5)]
    monkeypatch.setattr(filter_run, "_FINGERPRINTS", {})
    monkeypatch.setattr(filter_run, "PARALLEL_FINGERPRINT_ROWS", 10)
    monkeypatch.setattr(filter_run, "FINGERPRINT_CHUNK", 7)
    assert filter_run.prefill_fingerprints(cluster.client, cluster.cpu_workers, codes[:9]) == 0  # too few
    assert filter_run.prefill_fingerprints(cluster.client, [], codes) == 0  # no CPU workers
    assert filter_run._FINGERPRINTS == {}
    assert filter_run.prefill_fingerprints(cluster.client, cluster.cpu_workers, codes + codes[:3] + [None]) == 30
    assert len(filter_run._FINGERPRINTS) == 30
    for code, got in zip(codes, filter_run._fingerprints(codes), strict=True):
        want = fingerprint(code)
        assert got.exact_key == want.exact_key and got.signature == want.signature
        assert list(got.minhash.hashvalues) == list(want.minhash.hashvalues)
    assert filter_run.prefill_fingerprints(cluster.client, cluster.cpu_workers, codes) == 0  # all cached


def test_composer_shards_fingerprint_their_sources_for_the_client(cluster, catalog_path, monkeypatch):
    """``compose_shard(..., fingerprints=True)`` returns each row's duplicate-filter fingerprint (the client's
    own), and a ``ShardFeed`` with ``fingerprints`` puts them in the client's cache as each shard arrives."""
    from opforge.filters.duplicate import fingerprint
    from opforge.pipeline.compose_tasks import ShardFeed
    from opforge.pipeline.filter_run import _fingerprint_key

    cfg = _cfg("unused", catalog_path).resolved()
    cluster.client.register_plugin(composer_files(catalog_path, None, None), name=PLUGIN_NAME)
    options = _compose_options(cfg)
    plain = cluster.client.submit(compose_shard, options, 0, 4, pure=False).result()
    out = cluster.client.submit(compose_shard, options, 0, 4, True, pure=False).result()
    assert "fingerprints" not in plain and out["rows"] == plain["rows"]
    codes = [r["code"] for r in out["rows"] if r is not None]
    assert codes and len(out["fingerprints"]) == len(out["rows"])
    for row, got in zip(out["rows"], out["fingerprints"], strict=True):
        if row is None:
            assert got is None
            continue
        want = fingerprint(row["code"])
        assert got.exact_key == want.exact_key and got.signature == want.signature
        assert list(got.minhash.hashvalues) == list(want.minhash.hashvalues)

    monkeypatch.setattr(filter_run, "_FINGERPRINTS", {})
    watched = []
    feed = ShardFeed(cluster.client, options, 4, None, lambda f, cb: watched.append((f, cb)), "fp-test",
                     fingerprints=True)
    feed.submit(0)
    for future, callback in watched:
        future.result()
        callback(future)
    taken = feed.take_any(0)
    assert taken is not None and taken[0] == 0 and [r["code"] for r in taken[1] if r is not None] == codes
    assert all(_fingerprint_key(c) in filter_run._FINGERPRINTS for c in codes)


def test_dispatcher_step_handles_every_done_future_and_refills_the_window(cluster):
    """A done future holds its place in the window until handled: one ``step`` handles every done one, so the
    window refills at once however slowly the caller steps."""
    import time

    from distributed import Future, wait
    from opforge.engine.dispatch import Dispatcher

    got: list[str] = []
    d = Dispatcher(cluster.client, lambda x, alone, reserve_gib: {"x": x}, lambda k, r: got.append(k),
                   lambda k, e: {"error": str(e)}, window=3, key_prefix="dispatch-step-test", progress=False)
    d.add((f"i{i}", (i,)) for i in range(7))
    assert d.in_flight == 3 and len(d.queue) == 4
    wait([Future(key, cluster.client) for key in d.item_of])
    deadline = time.monotonic() + 30
    while len(d.pending.queue.queue) < 3 and time.monotonic() < deadline:  # as_completed has seen them
        time.sleep(0.01)
    assert d.step()
    assert {"i0", "i1", "i2"} <= set(got)  # (and any refill that finished meanwhile)
    assert d.in_flight == min(3, 7 - len(got)) and len(d.queue) == 7 - len(got) - d.in_flight  # refilled
    d.drain()
    assert sorted(got) == [f"i{i}" for i in range(7)] and not d.busy


def test_a_missing_seed_catalog_fails_before_the_cluster_starts(tmp_path, monkeypatch):
    from opforge.pipeline import run as run_module

    def no_cluster(*args, **kwargs):
        pytest.fail("the cluster started for a run that cannot harvest")

    monkeypatch.setattr(run_module, "_StreamedJob", no_cluster)
    with pytest.raises(ConfigError, match="seeds_catalog: .*missing.parquet: no such file"):
        run_pipeline(_cfg(tmp_path / "run", tmp_path / "missing.parquet"), progress=False)


def test_embedded_scheduler_runs_apart_and_dies_with_its_client():
    """The embedded cluster's scheduler is a process of its own (``engine.scheduler_process``), and a client
    killed outright leaves no scheduler behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    handle = open_cluster("cpu", workers=1)
    try:
        pid = handle.client.run_on_scheduler(os.getpid)
        assert pid != os.getpid() and handle.client.submit(sum, [1, 2], pure=False).result() == 3
    finally:
        handle.close()
    script = ("import os, time\nfrom opforge.engine.cluster import open_cluster\n"
              "h = open_cluster('cpu', workers=1)\nprint(h.client.run_on_scheduler(os.getpid), flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        scheduler = int(proc.stdout.readline())
        os.kill(scheduler, 0)  # alive while its client is
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if psutil.Process(scheduler).status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"scheduler process {scheduler} outlived its killed client")
    finally:
        proc.kill()


def test_gpu_busy_share_is_the_union_of_lock_holds_per_gpu():
    from opforge.pipeline.timeline import Timeline, format_timeline, gpu_busy

    spans = [("gpu0", 0.0, 10.0, {"compute_shared": 4.0}),      # held 6..10
             ("gpu0", 5.0, 12.0, {"compute_shared": 4.0, "compute_exclusive": 1.0}),  # 7..12: union 6..12
             ("gpu1", 0.0, 20.0, {"compute_shared": 30.0}),     # clipped to its start: 0..20
             ("gpu1", 0.0, 3.0, {"memory": 3.0})]               # no compute lock held: not counted
    g = gpu_busy(spans, after=2.0, until=22.0, run_start=0.0, run_end=40.0)
    assert g["per_gpu"]["gpu0"] == {"share_after_first_candidates": 0.3,
                                    "share_after_first_candidates_to_run_end": round(6 / 38, 4), "share_of_run": 0.15}
    assert g["per_gpu"]["gpu1"] == {"share_after_first_candidates": 0.9,
                                    "share_after_first_candidates_to_run_end": round(18 / 38, 4), "share_of_run": 0.5}
    assert g["share_after_first_candidates_to_run_end"] == round((6 / 38 + 18 / 38) / 2, 4)
    assert g["gpus"] == 2 and g["share_after_first_candidates"] == 0.6
    assert gpu_busy([("cpu0", 0.0, 1.0, {})], 0.0, 1.0, 0.0, 1.0) is None
    assert "approximate" in g["method"]
    # recorded hold spans are used as they are (the union per GPU), the held seconds only where they are missing
    exact = [("gpu0", 0.0, 10.0, {"compute_shared": 4.0}, [[2.0, 4.0], [8.0, 10.0]]),
             ("gpu0", 3.0, 12.0, {"compute_shared": 2.0}, [[3.0, 5.0]]),
             ("gpu1", 0.0, 20.0, {"compute_shared": 1.0}, [[10.0, 11.0]])]
    g = gpu_busy(exact, after=2.0, until=22.0, run_start=0.0, run_end=40.0)
    assert g["per_gpu"]["gpu0"]["share_after_first_candidates"] == 0.25
    assert g["per_gpu"]["gpu0"]["share_of_run"] == 0.125
    assert g["per_gpu"]["gpu1"]["share_after_first_candidates"] == 0.05 and "approximate" not in g["method"]
    g = gpu_busy(exact + [("gpu1", 0.0, 20.0, {"compute_shared": 2.0}, None)], 2.0, 22.0, 0.0, 40.0)
    assert g["per_gpu"]["gpu1"]["share_after_first_candidates"] == 0.15 and "approximate" in g["method"]
    t = Timeline()
    t.begin("filter", at=100.0)
    t.end("filter", at=110.0, busy_s=30.0)
    t.mark("first_candidates", at=102.0)
    rec = t.record([("gpu0", 100.0, 110.0, {"compute_shared": 4.0})])
    assert rec["stages"]["filter"] == {"start": 100.0, "end": 110.0, "wall_s": 10.0, "busy_s": 30.0}
    assert rec["gpu_busy"]["share_after_first_candidates"] == 0.5 and "compose_shards" not in rec
    rec = t.record(None, [("c0", 101.0, 103.0, 0, 0), ("c1", 101.5, 102.0, 0, 1), ("c0", 104.0, 106.5, 1, 0)])
    assert rec["compose_shards"] == {"shards": 3, "seconds_p50": 2.0, "seconds_max": 2.5,
                                     "rounds_s": {"0": [1.0, 3.0], "1": [4.0, 6.5]}}
    assert any("composer shards: 3" in line for line in format_timeline(rec))


def test_rounds_are_composed_ahead_one_at_a_time_up_to_the_lookahead_and_the_budget(tmp_path):
    """``compose_ahead`` sends the next round not composed yet, up to ``AHEAD_ROUNDS`` past the filtered one,
    only once the nearer rounds are composed, only while the run is short of its target, and never past the
    candidate budget."""
    from types import SimpleNamespace

    from opforge.pipeline import run as run_mod

    class Feed:
        def __init__(self):
            self.submitted, self.pending = set(), set()

        def submit(self, k):
            self.submitted.add(k)
            self.pending.add(k)

        def composing(self, k):
            return k in self.pending

    def job(budget=100, short=True, accepted=0):
        stream = SimpleNamespace(verdicted=100, accepted=accepted, pending=0)
        return SimpleNamespace(feed=Feed(), run_dir=tmp_path, short=short, stream=stream,
                               cfg=SimpleNamespace(round_size=10, candidate_budget=budget, target=50))

    ahead = _StreamedJob.compose_ahead
    j = job()
    ahead(j, 3, 30)
    ahead(j, 3, 30)
    assert j.feed.submitted == {4}  # round 5 waits while round 4 is composing
    j.feed.pending.clear()
    ahead(j, 3, 30)
    assert j.feed.submitted == {4, 5}
    j.feed.pending.clear()
    ahead(j, 3, 30)
    assert j.feed.submitted == {4, 5} and run_mod.AHEAD_ROUNDS == 2  # no further than the lookahead
    (tmp_path / "candidates").mkdir()
    (tmp_path / "candidates" / "round-0004.parquet").write_bytes(b"")  # a round composed before the run
    j = job()
    ahead(j, 3, 30)
    assert j.feed.submitted == {5}
    # rounds 0-2 (30 candidates) + round 3 + round 4 on disk + round 5 = 60 candidates
    j = job(budget=59)
    ahead(j, 3, 30)
    assert j.feed.submitted == set()
    j = job(budget=60)
    ahead(j, 3, 30)
    assert j.feed.submitted == {5}
    j = job(short=False, accepted=90)  # projected 90 accepted >= 1.5 x 50: nothing composed ahead
    ahead(j, 0, 0)
    assert j.feed.submitted == set()
    j = job(short=False, accepted=10)
    ahead(j, 0, 0)
    assert j.feed.submitted == {1}


def test_next_round_sent_ahead_gives_the_run_of_rounds_filtered_one_after_another(cluster, catalog_path, tmp_path,
                                                                                 monkeypatch):
    """While a round's last verdicts come in, the next round's rows go to the filter (``prefeed``: from round
    files composed before the run, or from the composers' shards), and the ones that round's decisions skip
    are taken back out of the queue: the candidates, verdicts and selection are those of a run that adds each
    round only after the round before is decided."""
    monkeypatch.setattr(compose_tasks, "SHARD_SIZE", 3)  # two shards per round
    taken_back: list[int] = []
    original = FilterStream.discard

    def counted(self, task_ids):
        taken_back.append(original(self, task_ids))
        return taken_back[-1]

    monkeypatch.setattr(FilterStream, "discard", counted)

    class OneInFlight(filter_run.Dispatcher):  # rows sent ahead wait in the queue until the round is decided
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "window": 1})

    monkeypatch.setattr(filter_run, "Dispatcher", OneInFlight)
    # a heavy-op cap the first rounds cannot hold: later rounds skip their heavy-op candidates
    update = {"target": 8, "round_size": 6, "motif_share": 0.9, "max_heavy_share": 0.2, "cap_rounds": 2,
              "scheduler": cluster.client.scheduler.address}

    def run(name, composed_first=True):
        cfg = _cfg(tmp_path / name, catalog_path).model_copy(update=update)
        if composed_first:  # rounds composed before the run (as on a CPU machine): round k + 1 is there
            compose_rounds(cfg, 4, workers=1, progress=False)
        return run_pipeline(cfg, progress=False), tmp_path / name

    _, ahead = run("ahead")
    prefeed, compose_ahead = _StreamedJob.prefeed, _StreamedJob.compose_ahead

    def from_composed_shards(self, k):  # the next round's shards all composed before the first is taken
        while any(key[0] == k for key in self.feed.futures) and self.stream.step():
            pass
        prefeed(self, k)

    def always_ahead(self, k, composed):
        self.short = True
        compose_ahead(self, k, composed)

    monkeypatch.setattr(_StreamedJob, "prefeed", from_composed_shards)
    monkeypatch.setattr(_StreamedJob, "compose_ahead", always_ahead)
    _, shards = run("shards", composed_first=False)  # rows sent ahead from the composers' shards
    monkeypatch.setattr(_StreamedJob, "prefeed", lambda self, k: None)  # each round only after the one before
    _, serial = run("serial")
    record = json.loads((ahead / "run.json").read_text())
    assert record["rounds"] >= 2 and record["tasks_sent_ahead"] > 0
    assert record["not_filtered_heavy_cap"] > 0 and sum(taken_back) > 0
    assert json.loads((shards / "run.json").read_text())["tasks_sent_ahead"] > 0
    assert json.loads((serial / "run.json").read_text())["tasks_sent_ahead"] == 0
    for other in (ahead, shards):
        pd.testing.assert_frame_equal(pd.read_parquet(other / "candidates.parquet"),
                                      pd.read_parquet(serial / "candidates.parquet"))
        a, s = (pd.read_parquet(d / "filter" / "verdicts.parquet")[VERDICT] for d in (other, serial))
        pd.testing.assert_frame_equal(a, s)
        assert (json.loads((other / "selection.json").read_text())
                == json.loads((serial / "selection.json").read_text()))
    for other in (ahead, shards):
        lines = [json.loads(x)["task_id"] for x in (other / "filter" / "ledger.jsonl").read_text().splitlines()]
        assert len(lines) == len(set(lines))  # nothing verdicted twice


def test_resumed_run_replays_the_decisions_of_its_finished_rounds(cluster, catalog_path, tmp_path, monkeypatch):
    """A run started again over its finished rounds replays each round's recorded skips (full signatures and
    heavy-op candidates) and makes a selection only for the rounds whose next round has no record: the same
    candidates, verdicts and selection as the first run, with fewer selections; a changed option decides every
    round again, and a record of other candidates counts for nothing."""
    from opforge.pipeline import select

    calls: list[int] = []
    original = select.select_tasks

    def counted(*args, **kw):
        calls.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(select, "select_tasks", counted)
    # a heavy-op cap the first rounds cannot hold: later rounds skip their heavy-op candidates
    cfg = _cfg(tmp_path / "run", catalog_path).model_copy(update={
        "target": 8, "round_size": 6, "motif_share": 0.9, "max_heavy_share": 0.2, "cap_rounds": 2,
        "scheduler": cluster.client.scheduler.address})
    out = tmp_path / "run"

    def outputs():
        return (pd.read_parquet(out / "candidates.parquet"),
                pd.read_parquet(out / "filter" / "verdicts.parquet")[VERDICT],
                json.loads((out / "selection.json").read_text()))

    run_pipeline(cfg, progress=False)
    first, n_first = outputs(), len(calls)
    run = json.loads((out / "run.json").read_text())
    assert run["rounds"] >= 3 and n_first == run["rounds"] and run["not_filtered_heavy_cap"] > 0
    lines = (out / "candidates" / "decisions.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["round"] for x in lines) == list(range(run["rounds"] - 1))  # the stop round: none

    def same_as_first():
        again = outputs()
        pd.testing.assert_frame_equal(again[0], first[0])
        pd.testing.assert_frame_equal(again[1], first[1])
        assert again[2] == first[2]

    del calls[:]
    run_pipeline(cfg, progress=False)
    same_as_first()
    assert len(calls) == 2  # the round before the stop round, and the stop round
    replayed = json.loads((out / "run.json").read_text())["timeline"]["client_rounds"]
    assert [r["select_s"] == 0 for r in replayed.values()] == [True] * (run["rounds"] - 2) + [False] * 2
    # another option (a candidate budget that does not bind): every round is decided again, to the same end
    del calls[:]
    run_pipeline(cfg.model_copy(update={"candidate_budget": 10 ** 6}), progress=False)
    same_as_first()
    assert len(calls) == run["rounds"]
    # a record whose candidates are not the round file's: that round and the one before it are decided again
    recs = [json.loads(x) for x in (out / "candidates" / "decisions.jsonl").read_text().splitlines()]
    for rec in recs:
        if rec["round"] == 1:
            rec["tasks"] = "0" * 64
    (out / "candidates" / "decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"cut')
    del calls[:]
    run_pipeline(cfg, progress=False)
    same_as_first()
    assert len(calls) == (4 if run["rounds"] > 3 else 3)


def test_shards_go_to_the_filter_as_they_arrive_and_the_round_file_keeps_index_order(tmp_path, monkeypatch):
    """A slow shard does not hold back the shards composed after it: the shards arrive 2, 0, 1; prefeed takes
    shard 0 ahead of the round loop, ``pieces`` yields it (as added), then 2, then 1, and the round file keeps the
    candidates in index order."""
    from types import SimpleNamespace

    from opforge.compose import composer
    from opforge.pipeline.compose_tasks import ShardFeed
    from opforge.pipeline.timeline import Timeline

    monkeypatch.setattr(composer, "rows_frame", lambda rows: pd.DataFrame([r for r in rows if r is not None]))
    arrival = [2, 0, 1]
    feed = ShardFeed(None, {}, 6, None, lambda f, cb: None, "order-test")
    feed.submit = lambda k: feed.submitted.add(k)
    rows = {j: [{"task_id": f"t{2 * j + i}", "code": f"c{2 * j + i}"} for i in range(2)] for j in range(3)}

    def step():  # the next shard arrives with each turn of the filter loop
        if not arrival:
            return False
        j = arrival.pop(0)
        feed.done[(0, j)] = rows[j]
        return True

    job = object.__new__(_StreamedJob)
    job.cfg = SimpleNamespace(round_size=6)
    job.run_dir, job.timeline, job.feed = tmp_path, Timeline(), feed
    job.stream = SimpleNamespace(step=step, deferred=0, add=lambda piece: len(piece))
    job.early_shards, job.early_rows, job._early_file, job.rows_by_task, job.prefed = {}, {}, None, {}, 0
    monkeypatch.setattr(compose_tasks, "SHARD_SIZE", 2)

    feed.submitted.add(0)
    step(), step()  # shards 2 and 0 composed; prefeed takes the lowest ready one (0) ahead of the round loop
    job.prefeed(0)
    assert list(job.early_shards[0]) == [0] and job.prefed == 2
    got = [(list(piece["task_id"]), added) for piece, added in job.pieces(0)]
    assert got == [(["t0", "t1"], True), (["t4", "t5"], False), (["t2", "t3"], False)]
    written = pd.read_parquet(tmp_path / "candidates" / "round-0000.parquet")
    assert list(written["task_id"]) == [f"t{i}" for i in range(6)]
    assert feed.done == {} and job.early_shards == {}
