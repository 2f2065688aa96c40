#!/usr/bin/env bash
# Throughput / scaling measurement on the lent GPU machine (issue #7), through the device tool:
#   carry: .whl runs/seeds runs/reference runs/gpu/cand_h200_1100.parquet
#   MODE=single bash benchmarks/device/gpu_throughput.sh   # opforge on GPU 0 + naive baseline (same candidates)
#   MODE=scale  bash benchmarks/device/gpu_throughput.sh   # opforge filter stage on every GPU, same candidates
#   MODE=resume RESUME=runs/gpu/resume bash ...     # finish a carried single-GPU run on every GPU
#   PROFILE=1 (single, two GPUs): after the naive baseline, benchmarks/gpu_cost_profile.py on the first
#   PROFILE_N (25) candidates on GPU 1 (cost_profile.json: kernel ms per task and filter, current logic)
#   GPU_TESTS=1 (single, two GPUs): after the naive baseline, `pytest -m gpu` on GPU 1 (log: gpu_tests.log)
#   HARNESS=1: benchmarks/harness_bench.py (harness_bench.json, harness.log): in single mode on two GPUs on
#   GPU 1 after the naive baseline (and the GPU tests), otherwise at the end on the last GPU; HARNESS_ARGS
#   adds arguments (e.g. --skip-solutions: only the 64-completion batch)
#   CALIB_N=300 (any mode): afterwards compose CALIB_N fresh candidates (seed 1, h200 profile) and time
#   them (static, eager, runtime only) to check the profile's calibration
#
# single: `opforge run` (compose N candidates, filter with --device cuda, select, Hub folder) pinned to
# GPU 0 and CPUs 0-15 (one H200 with 16 cores, the single-GPU kind's shape). On a machine with a second GPU
# the naive baseline (benchmarks/naive_baseline.py) runs at the same time on GPU 1 and CPUs 16-31 over the
# same candidates (composed here beforehand, carried: CANDS); with one GPU it runs after opforge. Each
# side has its own fresh Inductor/Triton cache. scale: `opforge filter` of CANDS on all GPUs and cores.
# nvidia-smi samples utilisation every 0.5 s, benchmarks/device/cpu_busy.py the busy share of CPUs 0-15 every 2 s
# (cpu_busy.csv). Results: $OUT/results.tgz (+ logs).
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=${WORK:-/tmp/gpuwork}
rm -rf "$W"; mkdir -p "$W"
CANDS=${CANDS:-runs/gpu/cand_h200_1100.parquet}
N=$(python3 -c "import pyarrow.parquet as pq; print(pq.read_metadata('$CANDS').num_rows)")
WORKERS=${WORKERS:-14}
NGPU=$(nvidia-smi -L | wc -l)
NCPU=$(nproc)
KB=runs/reference/kernelbench.jsonl
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
echo "cpus $NCPU gpus $NGPU candidates $N mode ${MODE:-single}" | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
    > "$W/gpu_util.csv" &
SMI=$!
# CPUs of opforge's side in single mode (0-15), or all of them
python3 benchmarks/device/cpu_busy.py --cpus "0-$(( NCPU >= 32 ? 15 : NCPU - 1 ))" --every 2 --out "$W/cpu_busy.csv" &
CPUB=$!

naive() {  # naive baseline on GPU $1, CPUs $2, for at most $3 seconds
    CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_CACHE_DIR=$W/cache-naive TRITON_CACHE_DIR=$W/cache-naive/triton \
        timeout $(( $3 + 90 )) taskset -c "$2" python3 benchmarks/naive_baseline.py "$CANDS" --limit "$N" \
        --device cuda --task-timeout-s 60 --max-seconds "$3" --out "$W/naive.json" > "$W/naive.log" 2>&1
}

harness() {  # hand-written CUDA solutions and the 64-completion reward batch on GPU $1, CPUs $2
    CUDA_VISIBLE_DEVICES=$1 timeout "${HARNESS_S:-360}" taskset -c "$2" python3 benchmarks/harness_bench.py \
        --out "$OUT/harness_bench.json" --batch 64 --workers "${HARNESS_WORKERS:-8}" ${HARNESS_ARGS:-} \
        > "$OUT/harness.log" 2>&1
}

if [ "${MODE:-single}" = single ]; then
    if [ "$NGPU" -ge 2 ] && [ "$NCPU" -ge 32 ]; then
        ( naive 1 16-31 "${NAIVE_S:-420}"
          if [ -n "${PROFILE:-}" ]; then
              CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=$W/cache-prof TRITON_CACHE_DIR=$W/cache-prof/triton \
                  timeout "${PROFILE_S:-120}" taskset -c 16-31 python3 benchmarks/gpu_cost_profile.py "$CANDS" \
                  --limit "${PROFILE_N:-25}" --out "$W/cost_profile.json" > "$W/cost_profile.log" 2>&1
          fi
          if [ -n "${GPU_TESTS:-}" ]; then
              CUDA_VISIBLE_DEVICES=1 timeout "${GPU_TESTS_S:-240}" taskset -c 16-31 python3 -m pytest -m gpu -n 4 \
                  -q -p no:cacheprovider tests/test_harness.py tests/test_execution_filters.py > "$OUT/gpu_tests.log" 2>&1
          fi
          if [ -n "${HARNESS:-}" ]; then harness 1 16-31; fi ) &
        BG=$!  # naive, GPU tests, harness on GPU 1
    fi
    CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=$W/cache-opforge TRITON_CACHE_DIR=$W/cache-opforge/triton \
        timeout "${LIMIT:-500}" taskset -c 0-15 python3 -m opforge.pipeline.cli run --device cuda \
        --target "${TARGET:-600}" --workers "$WORKERS" --out "$W/run" --seeds-catalog runs/seeds/catalog.parquet \
        --device-profile h200 --round-size "$N" --candidate-budget "$N" --timeout-s 60 --kernelbench "$KB" 2>&1 \
        | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s" | tee "$W/run.log"
    if [ -n "${BG:-}" ]; then wait "$BG"; else naive 0 0-15 "${NAIVE_S:-240}"; fi
    python3 - "$CANDS" "$W/run/candidates.parquet" <<'EOF' | tee -a "$W/run.log"
import sys, pandas as pd
a, b = (set(pd.read_parquet(p)["task_id"]) for p in sys.argv[1:3])
print(f"carried candidates == run's own composition: {a == b} ({len(a & b)} shared of {len(a)})")
EOF
elif [ "${MODE}" = resume ]; then  # finish a carried run directory (RESUME): on every GPU, or with
    # ONE_GPU=1 on GPU 0 and CPUs 0-15 only (then HARNESS runs at the same time on GPU 1, CPUs 16-31)
    cp -r "$RESUME" "$W/run"
    PIN=()
    if [ -n "${ONE_GPU:-}" ]; then
        export CUDA_VISIBLE_DEVICES=0
        PIN=(taskset -c 0-15)
        if [ -n "${HARNESS:-}" ] && [ "$NGPU" -ge 2 ]; then
            ( CUDA_VISIBLE_DEVICES=1 harness 1 16-31 ) &
            BG=$!
        fi
    fi
    TORCHINDUCTOR_CACHE_DIR=$W/cache-opforge TRITON_CACHE_DIR=$W/cache-opforge/triton timeout "${LIMIT:-420}" \
        "${PIN[@]}" python3 -m opforge.pipeline.cli run --device cuda \
        --target "${TARGET:-600}" --workers "$WORKERS" --out "$W/run" --seeds-catalog runs/seeds/catalog.parquet \
        --device-profile h200 --round-size "$N" --candidate-budget "$N" --timeout-s 60 --kernelbench "$KB" 2>&1 \
        | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s" | tee "$W/run.log"
    if [ -n "${BG:-}" ]; then wait "$BG"; fi
else
    TORCHINDUCTOR_CACHE_DIR=$W/cache-scale TRITON_CACHE_DIR=$W/cache-scale/triton timeout "${LIMIT:-420}" \
        python3 -m opforge.pipeline.cli filter "$CANDS" "$W/filter-scale" --device cuda --workers "$WORKERS" \
        --timeout-s 60 --kernelbench "$KB" 2>&1 | stdbuf -o0 tr "\r" "\n" \
        | grep --line-buffered -v -E "(it|task|block|problem)/s" | tee "$W/run.log"
fi
if [ -n "${HARNESS:-}" ] && [ -z "${BG:-}" ]; then  # not already run on GPU 1 in the background
    harness $(( NGPU - 1 )) "0-$(( NCPU - 1 ))"
fi
if [ -n "${CALIB_N:-}" ]; then  # check of the calibrated profile: eager time of fresh candidates
    python3 -m opforge.pipeline.cli compose --seeds runs/seeds/catalog.parquet --n "$CALIB_N" --seed 1 \
        --device-profile h200 --out "$W/calib.parquet" --workers 16 2>&1 | tail -1 | tee -a "$W/run.log"
    timeout "${CALIB_LIMIT:-150}" python3 -m opforge.pipeline.cli filter "$W/calib.parquet" "$W/filter-calib" \
        --device cuda --workers "$WORKERS" --only static,eager,runtime --timeout-s 60 2>&1 | stdbuf -o0 tr "\r" "\n" \
        | grep --line-buffered -v -E "(it|task|block|problem)/s" | tee -a "$W/calib.log"
fi
kill $SMI $CPUB 2>/dev/null
sleep 3  # sandbox children of a command cut by its timeout notice their parent's death within 1 s
cd "$W" && { rm -rf run/seeds cache-* run/hf/data 2>/dev/null; tar czf "$OUT/results.tgz" --exclude='*.log' --exclude='cache-*' .; cp ./*.log "$OUT/" 2>/dev/null; }
ls -la "$OUT"
# the device tool brings back a few files only: everything in one archive
cd "$OUT" && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/"
exit 0
