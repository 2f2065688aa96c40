#!/usr/bin/env bash
# Short same-call throughput ratio on a two-GPU machine, for when little device time is left (issue #7):
#   carry: .whl runs/seeds runs/reference runs/gpu/cand_h200_1100.parquet
#   OPF_S=200 NAIVE_S=170 bash benchmarks/device/gpu_short_ratio.sh
# `opforge run` (compose + filter of the 1,100 candidates, as gpu_throughput.sh) on GPU 0 / CPUs 0-15, cut
# after OPF_S seconds, and at the same time the naive baseline on GPU 1 / CPUs 16-31 over the same candidates
# in the same order, starting no task after NAIVE_S seconds. Every 2 s the verdicts in opforge's ledger are
# counted (ledger_count.csv: unix time, lines), nvidia-smi samples utilisation (gpu_util.csv) and
# benchmarks/device/cpu_busy.py the busy share of CPUs 0-15 (cpu_busy.csv). Then `pytest -m gpu -k $TESTS_K` on
# GPU 1. Small results are written straight to $OUT, so a call cut by its limit still returns them.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=/tmp/gpuwork
rm -rf "$W"; mkdir -p "$W"
CANDS=runs/gpu/cand_h200_1100.parquet
N=$(python3 -c "import pyarrow.parquet as pq; print(pq.read_metadata('$CANDS').num_rows)")
OPF_S=${OPF_S:-200}
NAIVE_S=${NAIVE_S:-170}
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
echo "cpus $(nproc) candidates $N opforge ${OPF_S}s naive ${NAIVE_S}s start $(date +%s.%N)" | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
    > "$OUT/gpu_util.csv" &
SMI=$!
python3 benchmarks/device/cpu_busy.py --cpus 0-15 --every 2 --out "$OUT/cpu_busy.csv" &
CPUB=$!
( while sleep 2; do echo "$(date +%s.%N),$(cat "$W/run/filter/ledger.jsonl" 2>/dev/null | wc -l)"; done ) \
    > "$OUT/ledger_count.csv" &
COUNT=$!
CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=$W/cache-naive TRITON_CACHE_DIR=$W/cache-naive/triton \
    timeout $(( NAIVE_S + 30 )) taskset -c 16-31 python3 benchmarks/naive_baseline.py "$CANDS" --limit "$N" \
    --device cuda --task-timeout-s 60 --max-seconds "$NAIVE_S" --out "$OUT/naive.json" > "$OUT/naive.log" 2>&1 &
NAIVE=$!
echo "opforge start $(date +%s.%N)" | tee -a "$OUT/gpu.txt"
CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=$W/cache-opforge TRITON_CACHE_DIR=$W/cache-opforge/triton \
    timeout "$OPF_S" taskset -c 0-15 python3 -m opforge.pipeline.cli run --device cuda --target 600 \
    --workers "${WORKERS:-14}" --out "$W/run" --seeds-catalog runs/seeds/catalog.parquet --device-profile h200 \
    --round-size "$N" --candidate-budget "$N" --timeout-s 60 --kernelbench runs/reference/kernelbench.jsonl \
    > "$OUT/run.log" 2>&1
echo "opforge end $(date +%s.%N) rc $?" | tee -a "$OUT/gpu.txt"
wait "$NAIVE"
echo "naive end $(date +%s.%N)" | tee -a "$OUT/gpu.txt"
if [ -n "${TESTS_K:-}" ]; then
    CUDA_VISIBLE_DEVICES=1 timeout "${TESTS_S:-60}" python3 -m pytest -m gpu -k "$TESTS_K" -q -p no:cacheprovider \
        tests/test_execution_filters.py > "$OUT/gpu_tests.log" 2>&1
fi
kill $SMI $CPUB $COUNT 2>/dev/null
sleep 2
cp "$W/run/filter/ledger.jsonl" "$W/run/run.json" "$W/run/filter/funnel.json" "$OUT/" 2>/dev/null
grep -h "" "$W"/run/filter/logs/*.log 2>/dev/null | tail -c 20000 > "$OUT/sandbox_logs_tail.txt"
ls -la "$OUT"
exit 0
