#!/usr/bin/env bash
# A/B of the execution engine (issue #23) on one GPU: the same `opforge filter` call on the same candidates,
# first through the old code (a git archive of the commit before engine/), then through this working tree,
# one after the other on the whole machine, each with its own Inductor / Triton cache and temporary folder.
# Through the device tool, one call (<= 10 min) on one H200:
#   made here:  mkdir -p runs/ab && git archive -o runs/ab/old.tar OLD_COMMIT task seeds compose filters \
#                   pipeline harness data_cards
#   carry:      .whl runs/reference runs/gpu/cand_h200_1100.parquet runs/ab
#   command:    bash benchmarks/device/engine_ab.sh
# Options (environment): OLD_TAR (runs/ab/old.tar), CANDS (runs/gpu/cand_h200_1100.parquet), AB_N (900: the
# first N candidates), AB_S (270: seconds per side at most), WORKERS (14 sandboxes).
# Result: $OUT/engine_ab.json = per side: tasks/min of the run (funnel.json: verdicts / wall seconds of the
# filter stage, cluster start included; a side cut by AB_S has no funnel and counts verdicts / AB_S, a lower
# bound), verdict counts per reason; the new/old ratio, and how many tasks verdicted on both sides got the
# same accepted / reason. Logs, ledgers and funnels: $OUT/engine_ab.tgz.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=${WORK:-/tmp/engine_ab}
rm -rf "$W"; mkdir -p "$W" "$OUT"
CANDS=${CANDS:-runs/gpu/cand_h200_1100.parquet}
OLD_TAR=${OLD_TAR:-runs/ab/old.tar}
KB=runs/reference/kernelbench.jsonl
[ -f "$OLD_TAR" ] || { echo "no $OLD_TAR: make it with git archive (see the header)"; exit 1; }
mkdir -p "$W/old_src" "$W/old_site/opforge"
tar xf "$OLD_TAR" -C "$W/old_src" || exit 1
for d in task seeds compose filters pipeline harness data_cards; do ln -s "$W/old_src/$d" "$W/old_site/opforge/$d"; done
side() {  # name $1, extra environment $2 (NAME=VALUE ...)
    mkdir -p "$W/tmp_$1"
    # shellcheck disable=SC2086 - $2 is a list of NAME=VALUE
    env TMPDIR="$W/tmp_$1" TORCHINDUCTOR_CACHE_DIR="$W/cache_$1" TRITON_CACHE_DIR="$W/cache_$1/triton" $2 \
        python3 -c 'import opforge.filters.chain as m; print("imports", m.__file__)' > "$W/$1.log" 2>&1
    # shellcheck disable=SC2086
    env TMPDIR="$W/tmp_$1" TORCHINDUCTOR_CACHE_DIR="$W/cache_$1" TRITON_CACHE_DIR="$W/cache_$1/triton" $2 \
        timeout "${AB_S:-270}" python3 -m opforge.pipeline.cli filter "$CANDS" --out "$W/f_$1" --device cuda \
        --workers "${WORKERS:-14}" --limit "${AB_N:-900}" --timeout-s 60 --kernelbench "$KB" 2>&1 \
        | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s|distributed\." >> "$W/$1.log"
    sleep 3  # sandbox children of a side cut by its timeout notice their parent's death within 1 s
}
side old "PYTHONPATH=$W/old_site:$PYTHONPATH"
side new ""
python3 - "$W" "$OUT/engine_ab.json" "${AB_S:-270}" <<'EOF'
import json, sys
from collections import Counter
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
sides, verdicts = {}, {}
for name in ("old", "new"):
    recs = [json.loads(line) for line in (work / f"f_{name}" / "ledger.jsonl").read_text().splitlines()
            if line.strip()] if (work / f"f_{name}" / "ledger.jsonl").exists() else []
    funnel_path = work / f"f_{name}" / "funnel.json"
    funnel = json.loads(funnel_path.read_text()) if funnel_path.exists() else {}
    verdicts[name] = {r["task_id"]: (r["accepted"], r["reason"]) for r in recs}
    sides[name] = {
        "imports": (work / f"{name}.log").read_text().splitlines()[0],
        "verdicts": len(recs), "complete": bool(funnel),
        "run_tasks_per_min": funnel.get("tasks_per_min") or round(60 * len(recs) / float(sys.argv[3]), 2),
        "run_wall_s": funnel.get("wall_s"),
        "accepted": sum(1 for r in recs if r["accepted"]),
        "by_reason": dict(Counter((r["reason"] or "accepted").split(":")[0] for r in recs).most_common()),
        "gpu_lock_wait_s_total": funnel.get("gpu_lock_wait_s_total"),
        "sandbox_start_s_total": funnel.get("sandbox_start_s_total"),
    }
both = set(verdicts["old"]) & set(verdicts["new"])
same = sum(1 for t in both if verdicts["old"][t] == verdicts["new"][t])
old, new = sides["old"], sides["new"]
res = {"sides": sides, "verdicted_on_both": len(both), "same_verdict": same,
       "differing": sorted((t, verdicts["old"][t], verdicts["new"][t]) for t in both
                           if verdicts["old"][t] != verdicts["new"][t])[:50],
       "run_rate_ratio_new_over_old": (new["run_tasks_per_min"] / old["run_tasks_per_min"]
                                       if new["run_tasks_per_min"] and old["run_tasks_per_min"] else None)}
out.write_text(json.dumps(res, indent=1))
print(json.dumps(res, indent=1)[:3000])
EOF
cd "$W" && tar czf "$OUT/engine_ab.tgz" old.log new.log f_*/ledger.jsonl f_*/funnel.json 2>/dev/null
ls -la "$OUT"
exit 0
