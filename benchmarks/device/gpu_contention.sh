#!/usr/bin/env bash
# Diagnosis of the filter stage's GPU throughput on a two-GPU machine (issue #7), through the device tool:
#   carry: .whl runs/seeds runs/reference runs/gpu/cand_h200_1100.parquet
#   bash benchmarks/device/gpu_contention.sh
# 1. benchmarks/gpu_cost_profile.py on PROFILE_N tasks, one process: GPU 0 with Inductor's pointwise
#    autotuning (torch.compile's default), GPU 1 without; per filter the kernel milliseconds (CUPTI).
# 2. `opforge filter` of the same FILTER_N tasks, WORKERS sandboxes, for FILTER_S seconds on each GPU at
#    once: GPU 0 as in a plain run, GPU 1 under CUDA MPS (a control daemon for that GPU only, stopped at
#    the end; no GPU setting is changed). Verdict counts sampled every 5 s from each ledger.
# Each side has its own Inductor cache and lock folder. Results and logs under $OUT.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=${WORK:-/tmp/contention}
rm -rf "$W"; mkdir -p "$W"
CANDS=${CANDS:-runs/gpu/cand_h200_1100.parquet}
KB=runs/reference/kernelbench.jsonl
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
    > "$OUT/gpu_util.csv" &
SMI=$!

profile() {  # GPU $1, CPUs $2, extra args
    local g=$1 c=$2; shift 2
    CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=$W/cache-prof$g TRITON_CACHE_DIR=$W/cache-prof$g/triton \
        timeout "${PROFILE_S:-150}" taskset -c "$c" python3 benchmarks/gpu_cost_profile.py "$CANDS" \
        --limit "${PROFILE_N:-25}" --out "$OUT/cost_gpu$g.json" "$@" > "$OUT/cost_gpu$g.log" 2>&1
}
if [ -n "${PROFILE-1}" ]; then
    profile 0 0-15 &
    P0=$!
    profile 1 16-31 --no-autotune-pointwise
    wait $P0
    tail -n 45 "$OUT/cost_gpu0.log" "$OUT/cost_gpu1.log"
fi

count() {  # ledger line counts every 5 s
    while sleep 5; do
        echo "$(date +%s) $(wc -l 2>/dev/null < "$W/f0/ledger.jsonl" || echo 0) $(wc -l 2>/dev/null < "$W/f1/ledger.jsonl" || echo 0)"
    done > "$OUT/ledger_counts.txt"
}
count &
CNT=$!
filter() {  # GPU $1 (as seen by the process), CPUs $2, run dir $3, tmp dir $4
    mkdir -p "$4"
    TMPDIR=$4 CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_CACHE_DIR=$3-cache TRITON_CACHE_DIR=$3-cache/triton \
        timeout "${FILTER_S:-150}" taskset -c "$2" python3 -m opforge.pipeline.cli filter "$CANDS" "$3" \
        --device cuda --workers "${WORKERS:-14}" --limit "${FILTER_N:-400}" --timeout-s 60 --kernelbench "$KB" 2>&1 \
        | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s"
}
MPS=0
if command -v nvidia-cuda-mps-control > /dev/null; then
    mkdir -p "$W/mps" "$W/mpslog"
    CUDA_VISIBLE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mpslog \
        nvidia-cuda-mps-control -d && MPS=1
fi
echo "mps started: $MPS" | tee -a "$OUT/gpu.txt"
filter 0 0-15 "$W/f0" "$W/tmp0" > "$OUT/filter_plain.log" &
F0=$!
if [ "$MPS" = 1 ]; then
    CUDA_MPS_PIPE_DIRECTORY=$W/mps filter 0 16-31 "$W/f1" "$W/tmp1" > "$OUT/filter_mps.log"
else
    filter 1 16-31 "$W/f1" "$W/tmp1" > "$OUT/filter_mps.log"
fi
wait $F0
if [ "$MPS" = 1 ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$W/mps nvidia-cuda-mps-control
    cp "$W"/mpslog/* "$OUT/" 2>/dev/null
fi
kill $CNT $SMI 2>/dev/null
tail -n 5 "$OUT/ledger_counts.txt"
cp "$W"/f0/ledger.jsonl "$OUT/ledger_plain.jsonl"; cp "$W"/f1/ledger.jsonl "$OUT/ledger_mps.jsonl"
cd "$OUT" && tar czf /tmp/contention.tgz --exclude=contention.tgz . && mv /tmp/contention.tgz "$OUT/" && ls -la "$OUT"
exit 0
