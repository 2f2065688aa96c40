#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".whl"]): the runtime window's floor (benchmarks/timing_floor.py).
# Env: ALONE (5), BATCH (6), WORKERS (16), LIMIT (seconds for the measurement, 540). Result: $OUT/timing_floor.json
# (resumed by a later call on a warm machine), logs in $OUT/logs.tgz.
set -u
. benchmarks/device/device_setup.sh || exit 1
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/logs/gpu.csv" 2>&1
cp /tmp/timing_floor.json "$OUT/timing_floor.json" 2>/dev/null
timeout "${LIMIT:-540}" python3 benchmarks/timing_floor.py --alone "${ALONE:-5}" --batch "${BATCH:-6}" \
    --workers "${WORKERS:-16}" --work /tmp/opforge-timing-floor --out "$OUT/timing_floor.json" \
    > "$OUT/logs/timing_floor.log" 2>&1
echo "exit $?" >> "$OUT/logs/timing_floor.log"
cp "$OUT/timing_floor.json" /tmp/timing_floor.json 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
tail -c 3000 /tmp/opforge-timing-floor/report_alone/report.json 2>/dev/null | head -5
python3 -c "import json;d=json.load(open('$OUT/timing_floor.json'));print(json.dumps([{k:r.get(k) for k in ('seq_len','eager_ms','burst','cv_alone','cv_batch','batch_over_alone','speedup_alone_median')} for r in d.get('table',[])]));print('floor',d.get('floor_ms'))" 2>&1
