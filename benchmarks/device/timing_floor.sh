#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".whl", "runs/timing_floor.json"]): the runtime window's floor
# (benchmarks/timing_floor.py), with the GPU's clocks sampled every 100 ms (logs/clocks.csv). Env: ALONE (5), BATCH (8),
# WORKERS (16), LIMIT (seconds, 540), SEQS (sequence lengths, default the script's), PHASES (alone,batch). The result
# is saved after every evaluation to $OUT/timing_floor.json; copy it to runs/timing_floor.json here and carry
# it to resume on a fresh machine. Logs: $OUT/logs.tgz.
set -u
. benchmarks/device/device_setup.sh || exit 1
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/logs/gpu.csv" 2>&1
cp runs/timing_floor.json "$OUT/timing_floor.json" 2>/dev/null
# the GPU's clocks, power and temperature every 100 ms while the measurement runs
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,pstate --format=csv -lms 100 \
    > "$OUT/logs/clocks.csv" 2>&1 &
SMI=$!
timeout "${LIMIT:-540}" python3 benchmarks/timing_floor.py --alone "${ALONE:-5}" --batch "${BATCH:-8}" \
    --workers "${WORKERS:-16}" ${SEQS:+--seqs $SEQS} --phases "${PHASES:-alone,batch}" --work /tmp/opforge-timing-floor --out "$OUT/timing_floor.json" \
    > "$OUT/logs/timing_floor.log" 2>&1
echo "exit $?" >> "$OUT/logs/timing_floor.log"
kill $SMI 2>/dev/null
grep -E "^(alone|resuming|\[)" "$OUT/logs/timing_floor.log" | tail -20
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
