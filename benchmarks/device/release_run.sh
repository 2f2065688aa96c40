#!/usr/bin/env bash
# One lent-GPU call of a release run (device tool), for calls of at most 10 minutes:
#   CALL_S=580 EXTRA='--workers 10' bash benchmarks/device/release_run.sh
# CONFIG (default benchmarks/device/release_v2.yaml) is the release's `opforge run` config; its `out` is the run
# directory RUN. Carry .whl, runs/reference, the config's seed-catalog folder and RUN: its candidate rounds,
# composed on a CPU machine first (`opforge run --config CONFIG --compose-rounds N`), and, when the machine is not
# warm, the state an earlier call sent back ($OUT/STATE.partNN, carried as runs/STATE/); rounds composed later
# travel as runs/STATE-rounds/. The run resumes from RUN (finished rounds and ledger verdicts are kept) for what
# the call has left, less RESERVE seconds for what follows. RECHECK=N then re-checks N published rows drawn at
# random (seed RECHECK_SEED) with `opforge recheck`. The run's state (RUN less its round files, logs and
# sandboxes; candidates.parquet only with RECHECK) comes back as $OUT/STATE.partNN, parts of at most 15 MiB.
set -uo pipefail
START=$(date +%s)
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
CONFIG=${CONFIG:-benchmarks/device/release_v2.yaml}
RUN=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['out'])" "$CONFIG") || exit 3
STATE=${STATE:-$(basename "$RUN")-state}
filt() { stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op|model)/s|distributed\."; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"
# the state an earlier call sent back, carried as runs/STATE/*.part* (when the machine is not warm)
if [ ! -d "$RUN/filter" ] && ls "runs/$STATE"/*.part* > /dev/null 2>&1; then
    cat "runs/$STATE"/*.part* | tar xz || exit 3
fi
# rounds composed after the run directory travelled, carried as runs/STATE-rounds/ (on a warm machine, where
# carrying RUN would replace its state): copied into RUN/candidates where missing
if [ -d "runs/$STATE-rounds" ] && [ -d "$RUN/candidates" ]; then
    cp -n "runs/$STATE-rounds"/round-*.parquet "$RUN/candidates/" 2>/dev/null
fi
# never start a release over by accident: its rounds come carried, or stay from the last call
ls "$RUN"/candidates/round-*.parquet > /dev/null 2>&1 || { echo "no rounds in $RUN/candidates: carry $RUN"; exit 3; }
T0=$(date +%s)
LIMIT=${LIMIT:-540}
[ -n "${CALL_S:-}" ] && LIMIT=$(( START + CALL_S - T0 - ${RESERVE:-45} ))
if [ "$LIMIT" -gt 30 ]; then
    timeout "$LIMIT" python3 -m opforge.pipeline.cli run --config "$CONFIG" ${EXTRA:-} 2>&1 | filt \
        | tee -a "$OUT/release.log" | tail -8
fi
echo "release call wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/release.log"
if [ -d "$RUN/hf" ] && [ -n "${RECHECK:-}" ]; then
    [ -n "${CALL_S:-}" ] && RECHECK_LIMIT=${RECHECK_LIMIT:-$(( START + CALL_S - $(date +%s) - 30 ))}
    timeout "${RECHECK_LIMIT:-240}" python3 -m opforge.pipeline.cli recheck "$RUN/hf" "$RUN/recheck" --device cuda \
        --sample "$RECHECK" --seed "${RECHECK_SEED:-2027}" ${RECHECK_EXTRA:-} 2>&1 | filt | tail -40 \
        | tee "$OUT/recheck.log"
fi
python3 -m opforge.pipeline.cli status "$RUN" 2>&1 | tail -25 | tee -a "$OUT/release.log"
# candidates.parquet (the filter's input, rebuilt from the rounds by a resumed run) only with the last call's
EXCL=(--exclude="$RUN/candidates"); [ -n "${RECHECK:-}" ] || EXCL+=(--exclude="$RUN/candidates.parquet")
tar czf - --exclude='*/logs/*' --exclude='*.pkl' --exclude='*/sandboxes/*' "${EXCL[@]}" "$RUN" \
    | split -b 15M -d - "$OUT/$STATE.part"
ls -la "$OUT"
exit 0
