#!/usr/bin/env bash
# CUDA-Agent-Ops-6K through the filter chain on the lent GPU (device tool; carry .whl and runs/reference with
# ops6k_sample1000.parquet, a fixed random sample: DataFrame.sample(1000, random_state=0) of
# ../shared/reference/cuda_agent_ops_6k.parquet, its row index kept in column `row`):
#   bash benchmarks/device/gpu_ops6k_filter.sh
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
F=${F:-/tmp/ops6k_filter}
timeout "${LIMIT:-500}" python3 -m opforge.pipeline.cli filter runs/reference/ops6k_sample1000.parquet "$F" \
    --device cuda --workers "${WORKERS:-14}" --timeout-s 60 --kernelbench runs/reference/kernelbench.jsonl 2>&1 \
    | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op)/s|distributed\." | tee "$OUT/filter.log"
tar czf "$OUT/ops6k_filter.tgz" -C "$(dirname "$F")" --exclude='*/logs/*' --exclude='*.pkl' "$(basename "$F")"
exit 0
