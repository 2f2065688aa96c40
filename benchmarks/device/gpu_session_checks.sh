#!/usr/bin/env bash
# One lent-GPU call that re-checks the composer, the trivial filter and the grader on CUDA (device tool;
# carry .whl, runs/reference and runs/seeds_gpu, a seed catalog and shape vocabulary harvested there):
#   bash benchmarks/device/gpu_session_checks.sh
# 1. the CUDA tests of the grader (red team included) and of the trivial filter;
# 2. benchmarks/harness_bench.py on CUDA;
# 3. `opforge run --device cuda` (h200 profile) from that catalog (RUN may be a carried run directory: it
#    resumes), the realism figures of its published rows and `opforge recheck` of RECHECK_ROWS of them.
# Every step has its own time limit; logs and a tarball of the run's records land in $OUT.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
RUN=${RUN:-/tmp/gpurun2}
timeout "${TEST_LIMIT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_grader_redteam_gpu.py \
    tests/test_harness.py tests/test_trivial_filter.py tests/test_grader_isolation.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
timeout "${BENCH_LIMIT:-80}" python3 benchmarks/harness_bench.py --device cuda --out "$OUT/harness_bench_h200.json" \
    2>&1 | tee "$OUT/harness_bench.log" | tail -15
T0=$(date +%s)
timeout "${RUN_LIMIT:-220}" python3 -m opforge.pipeline.cli run --device cuda --target "${TARGET:-500}" \
    --seed "${SEED:-12}" --device-profile h200 --out "$RUN" --timeout-s 60 \
    --seeds-catalog runs/seeds_gpu/catalog.parquet --kernelbench runs/reference/kernelbench.jsonl 2>&1 \
    | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op)/s|distributed\." \
    | tee "$OUT/run.log" | tail -5
echo "run wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/run.log"
if [ -d "$RUN/hf" ]; then
    timeout 60 python3 benchmarks/realism_bench.py "$RUN/hf" --out "$RUN/realism_published.json" --workers 12 --cache '' \
        > "$RUN/realism_published.txt" 2>&1
    timeout 60 python3 benchmarks/realism_bench.py "$RUN/candidates.parquet" --out "$RUN/realism_candidates.json" \
        --workers 12 --cache '' > "$RUN/realism_candidates.txt" 2>&1
fi
if [ -d "$RUN/hf" ]; then
    timeout "${RECHECK_LIMIT:-90}" python3 -m opforge.pipeline.cli recheck "$RUN/hf" --device cuda "$RUN/recheck" \
        --limit "${RECHECK_ROWS:-300}" 2>&1 \
        | stdbuf -o0 tr "\r" "\n" | grep -v -E "(it|task)/s|distributed\." | tail -25 | tee "$OUT/recheck.log"
fi
tar czf "$OUT/run2.tgz" -C "$(dirname "$RUN")" --exclude='*/logs/*' --exclude='*.pkl' --exclude='*/seeds/*' \
    "$(basename "$RUN")"
ls -la "$OUT"
exit 0
