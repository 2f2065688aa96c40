#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".whl"]): the grader's speed-up spread at a few sizes under two
# settings, default (A) and a longer warm-up and timed phase (B: WARMUP_B warm-up rounds, TRIALS_B timed
# rounds, BURST_B ms bursts), alone evaluations only (benchmarks/timing_floor.py). Results: $OUT/A.json, $OUT/B.json.
set -u
. benchmarks/device/device_setup.sh || exit 1
mkdir -p "$OUT/logs"
SEQS=${SEQS:-200,400,1000,2000}
common=(--seqs "$SEQS" --alone "${ALONE:-3}" --phases alone --build-root /tmp/opforge-ext-probe)
timeout "${LIMIT_A:-270}" python3 benchmarks/timing_floor.py "${common[@]}" --work /tmp/tfA --out "$OUT/A.json" \
    > "$OUT/logs/A.log" 2>&1
timeout "${LIMIT_B:-270}" python3 benchmarks/timing_floor.py "${common[@]}" --work /tmp/tfB --out "$OUT/B.json" \
    --warmup "${WARMUP_B:-20}" --timing-trials "${TRIALS_B:-40}" --burst-ms "${BURST_B:-4}" > "$OUT/logs/B.log" 2>&1
grep -h "^\[" "$OUT"/logs/*.log
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
