#!/usr/bin/env bash
# GPU end-to-end run on the lent machine (device tool; carry .whl, runs/seeds and runs/reference, a copy of
# ../shared/reference/kernelbench.jsonl: ../shared does not travel):
#   N=1000 TARGET=500 WORKERS=12 bash benchmarks/device/gpu_run.sh
# Composes N candidates (one round, h100 profile), filters them with --device cuda (one Dask worker per GPU,
# WORKERS sandboxes each, window 1-100 ms), selects up to TARGET and builds the Hub folder. Samples GPU
# utilisation with nvidia-smi every 0.5 s. Everything lands in $OUT.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
RUN=${RUN:-/tmp/gpurun}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 > "$OUT/gpu_util.csv" &
SMI=$!
timeout "${LIMIT:-540}" python3 -m opforge.pipeline.cli run --device cuda --target "${TARGET:-500}" \
    --workers "${WORKERS:-12}" --out "$RUN" --seeds-catalog runs/seeds/catalog.parquet \
    --round-size "${N:-1000}" --candidate-budget "${N:-1000}" --timeout-s "${TIMEOUT_S:-60}" \
    --kernelbench "${KERNELBENCH:-runs/reference/kernelbench.jsonl}" 2>&1 \
    | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s" | tee "$OUT/run.log"
kill $SMI 2>/dev/null
for f in run.json config.yaml candidates.parquet selection.json filter/funnel.json filter/verdicts.parquet filter/ledger.jsonl; do
    [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"
done
[ -d "$RUN/hf" ] && cp -r "$RUN/hf" "$OUT/hf"
exit 0
