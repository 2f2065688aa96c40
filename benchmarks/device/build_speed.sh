#!/usr/bin/env bash
# Issue #58 on the H200: build speed and reward throughput with the light torch headers.
#   1. opforge harness toolchain --device cuda       (once per machine; timed apart)
#   2. python benchmarks/build_solutions_bench.py --full 3   (every gold / harness solution, one at a time)
#   3. python benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16
#   4. python benchmarks/env_episodes.py --device cuda --episodes 64
# Each step under its own timeout; results and logs under $OUT/bs (tar them: 8 files come back).
# STEPS (default "1 2 3 4") picks steps. Usage (device tool, repository root): bash benchmarks/device/build_speed.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/bs"
T0=$(date +%s)
. benchmarks/device/device_setup.sh > "$OUT/bs/setup.log" 2>&1 || { cat "$OUT/bs/setup.log"; exit 1; }
export OPFORGE_CACHE=${OPFORGE_CACHE:-/tmp/opforge-bs-cache}
STEPS=${STEPS:-"1 2 3 4"}
step() { echo "$(date -u +%T) step $1 start (t=$(( $(date +%s) - T0 )) s)" | tee -a "$OUT/bs/steps.log"; }
done_() { echo "$(date -u +%T) step $1 rc=$2 (t=$(( $(date +%s) - T0 )) s)" | tee -a "$OUT/bs/steps.log"; }
for s in $STEPS; do
  step "$s"
  case $s in
    1) timeout 240 opforge harness toolchain --device cuda > "$OUT/bs/toolchain.log" 2>&1 ;;
    2) timeout ${BUILD_S:-300} python3 benchmarks/build_solutions_bench.py --full ${FULL:-3} --out "$OUT/bs/build_solutions.json" > "$OUT/bs/build_solutions.log" 2>&1 ;;
    3) timeout ${BATCH_S:-300} python3 benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16 --out "$OUT/bs/harness_batch.json" > "$OUT/bs/harness_batch.log" 2>&1 ;;
    4) timeout ${EPISODES_S:-300} python3 benchmarks/env_episodes.py --device cuda --episodes 64 --out "$OUT/bs/env_episodes.json" > "$OUT/bs/env_episodes.log" 2>&1 ;;
  esac
  done_ "$s" $?
done
tail -3 "$OUT"/bs/*.log
echo "done wall_s=$(( $(date +%s) - T0 ))"
