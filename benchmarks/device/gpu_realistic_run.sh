#!/usr/bin/env bash
# The README's GPU user path on the lent machine (device tool; carry .whl and runs/reference, a copy of
# ../shared/reference: ../shared does not travel):
#   TARGET=700 bash benchmarks/device/gpu_realistic_run.sh
# `opforge run --device cuda` from an empty run directory (harvest included, composer with the h200 profile),
# then the realism figures of its candidates and of its published rows (benchmarks/realism_bench.py). Logs and a
# tarball of the run's records land in $OUT.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
RUN=${RUN:-/tmp/gpurun}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$RUN.util.csv" &
SMI=$!
T0=$(date +%s)
timeout "${LIMIT:-470}" python3 -m opforge.pipeline.cli run --device cuda --target "${TARGET:-700}" --seed "${SEED:-11}" \
    --device-profile h200 --out "$RUN" --timeout-s "${TIMEOUT_S:-60}" \
    --kernelbench runs/reference/kernelbench.jsonl 2>&1 \
    | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op)/s" | tee "$OUT/run.log"
echo "run wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/run.log"
kill $SMI 2>/dev/null
if [ -f "$RUN/candidates.parquet" ]; then
    timeout 60 python3 benchmarks/realism_bench.py "$RUN/candidates.parquet" --out "$RUN/realism_candidates.json" --workers 12 \
        > "$RUN/realism_candidates.txt" 2>&1
fi
if [ -d "$RUN/hf" ]; then
    timeout 60 python3 benchmarks/realism_bench.py "$RUN/hf" --out "$RUN/realism_published.json" --workers 12 \
        > "$RUN/realism_published.txt" 2>&1
fi
tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" --exclude='*/logs/*' --exclude='*.pkl' "$(basename "$RUN")" "$(basename "$RUN").util.csv"
ls -la "$OUT"
exit 0
