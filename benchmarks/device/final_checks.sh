#!/usr/bin/env bash
# Issues #57 / #58 on the H200, one call: the toolchain, the gold rows whose solutions changed (gold_eval.sh resumes
# from the carried runs/gold/results.jsonl, so only changed solutions are evaluated), both GPU red-team suites,
# the reward batch and the environment's episodes. Each step has its own timeout; logs under $OUT/fc.
# Usage (device tool, repository root, carry .whl and runs/gold): bash benchmarks/device/final_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/fc"
T0=$(date +%s)
. benchmarks/device/device_setup.sh > "$OUT/fc/setup.log" 2>&1 || { cat "$OUT/fc/setup.log"; exit 1; }
export OPFORGE_CACHE=${OPFORGE_CACHE:-/tmp/opforge-gold-cache}
left() { echo $(( ${BUDGET_S:-530} - ($(date +%s) - T0) )); }
log() { echo "$(date -u +%T) t=$(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/fc/steps.log"; }
log toolchain; timeout 200 opforge harness toolchain --device cuda > "$OUT/fc/toolchain.log" 2>&1; log "toolchain rc=$?"
log gold; OUT="$OUT/fc" EVAL_S=${GOLD_S:-150} BUDGET_S=400 timeout 260 bash benchmarks/device/gold_eval.sh > "$OUT/fc/gold_driver.log" 2>&1; log "gold rc=$?"
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 8"
log redteam; timeout ${REDTEAM_S:-240} python3 -m pytest -m gpu $N -q -p no:cacheprovider tests/test_grader_redteam_gpu.py tests/test_timing_gpu.py > "$OUT/fc/redteam.log" 2>&1; log "redteam rc=$?"
T=$(( $(left) - 20 )); [ $T -gt 150 ] && T=150
log "batch (timeout $T)"; [ $T -gt 30 ] && timeout $T python3 benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16 --out "$OUT/fc/harness_batch.json" > "$OUT/fc/harness_batch.log" 2>&1; log "batch rc=$?"
T=$(( $(left) - 10 ))
log "episodes (timeout $T)"; [ $T -gt 30 ] && timeout $T python3 benchmarks/env_episodes.py --device cuda --episodes 64 --out "$OUT/fc/env_episodes.json" > "$OUT/fc/env_episodes.log" 2>&1; log "episodes rc=$?"
tail -3 "$OUT/fc/redteam.log"
log done
