#!/usr/bin/env bash
# One lent-GPU call of the release run (device tool; carry .whl, runs/reference, runs/seeds_gpu,
# runs/release_rounds (rounds composed on the CPU machine since the last call) and, when the machine is not
# warm, runs/release6k):
#   DEMO=1 CALL_S=570 bash benchmarks/device/release_run.sh
# DEMO=1 first runs `opforge run --device cuda` from an empty run directory (harvest included, DEMO_TARGET
# tasks) for the harvest's wall time and skip reasons. Then `opforge run --config benchmarks/device/release6k.yaml`
# for at most LIMIT seconds (it resumes the run directory), BUDGET= caps the candidates (publishes what the
# rounds so far give), RECHECK=N re-checks N published rows drawn at random (seed 2026) with this tree's
# `opforge recheck`. The run's records (no logs) are tarred to $OUT.
# runs/tagtree (carried; `git archive release6k-build task seeds compose filters pipeline harness data_cards`
# unpacked there) is the code the release filters with: the ledger resumes only under the filter fingerprint
# of the code that started it, so that tree goes first on PYTHONPATH for the `opforge run` step only.
set -uo pipefail
START=$(date +%s)
if [ -f benchmarks/device/device_setup.sh ]; then . benchmarks/device/device_setup.sh || exit 1; else . benchmarks/device_setup.sh || exit 1; fi
OUT=${OUT:-/tmp/out}
RUN=runs/release6k
filt() { stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op)/s|distributed\."; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
if [ "${DEMO:-0}" = 1 ]; then
    rm -rf /tmp/demo; T0=$(date +%s)
    timeout "${DEMO_LIMIT:-200}" python3 -m opforge.pipeline.cli run --device cuda --target "${DEMO_TARGET:-20}" \
        --seed 5 --device-profile h200 --out /tmp/demo --timeout-s 60 --kernelbench runs/reference/kernelbench.jsonl \
        2>&1 | filt | tee "$OUT/demo.log" | tail -4
    echo "demo wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/demo.log"
    python3 - <<'PY' 2>&1 | tee -a "$OUT/demo.log"
import json, collections, pandas as pd
r = json.load(open("/tmp/demo/run.json")); print("run.json", json.dumps(r))
s = pd.read_csv("/tmp/demo/seeds/catalog_skipped.csv"); print("skips", len(s), dict(collections.Counter(x.split(":")[0] for x in s.reason)))
c = pd.read_parquet("/tmp/demo/seeds/catalog.parquet"); print("catalog", len(c), c.library.value_counts().to_dict())
PY
    cp /tmp/demo/seeds/catalog_skipped.csv "$OUT/demo_catalog_skipped.csv" 2>/dev/null
fi
# never start the release over by accident: its directory comes carried, or stays from the last call
[ -f "$RUN/config.yaml" ] || { echo "no $RUN/config.yaml: carry runs/release6k (the machine was not warm)"; exit 3; }
# candidate rounds composed on the CPU machine since the last call (carried as runs/release_rounds)
if [ -d runs/release_rounds ]; then
    mkdir -p "$RUN/candidates"
    for f in runs/release_rounds/round-*.parquet; do [ -e "$RUN/candidates/$(basename "$f")" ] || cp "$f" "$RUN/candidates/"; done
fi
T0=$(date +%s)
# CALL_S: the whole call's seconds; the release gets what the steps before left, less RESERVE for what follows
[ -n "${CALL_S:-}" ] && LIMIT=$(( START + CALL_S - T0 - ${RESERVE:-30} ))
EXTRA=""; [ -n "${BUDGET:-}" ] && EXTRA="--candidate-budget $BUDGET"
RUNPATH=$PYTHONPATH
if [ -d runs/tagtree ]; then
    mkdir -p /tmp/tagpkg && ln -sfn "$PWD/runs/tagtree" /tmp/tagpkg/opforge && RUNPATH=/tmp/tagpkg:$PYTHONPATH
fi
PYTHONPATH=$RUNPATH python3 -c 'import opforge.pipeline.run as m; print("release code:", m.__file__)' | tee -a "$OUT/release.log"
PYTHONPATH=$RUNPATH timeout "${LIMIT:-540}" python3 -m opforge.pipeline.cli run --config benchmarks/device/release6k.yaml $EXTRA 2>&1 \
    | filt | tee -a "$OUT/release.log" | tail -6
echo "release call wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/release.log"
if [ -d "$RUN/hf" ] && [ -n "${RECHECK:-}" ]; then
    timeout "${RECHECK_LIMIT:-240}" python3 -m opforge.pipeline.cli recheck "$RUN/hf" "$RUN/recheck" --device cuda \
        --sample "$RECHECK" --seed 2026 2>&1 | filt | tail -30 | tee "$OUT/recheck.log"
    timeout 90 python3 benchmarks/realism_bench.py "$RUN/hf" --out "$RUN/realism_published.json" --workers 14 --cache '' \
        > "$RUN/realism_published.txt" 2>&1
fi
tar czf "$OUT/release6k.tgz" --exclude='*/logs/*' --exclude='*.pkl' --exclude='*/sandboxes/*' "$RUN"
ls -la "$OUT"; du -sh "$RUN"/* 2>/dev/null
exit 0
