#!/usr/bin/env bash
# Issue #58 on the H200, one call: the toolchain, the reward batch, both GPU red-team suites, then the environment's
# episodes with what is left of BUDGET_S. A step named with "warm" after it (batchwarm, redteamwarm, episodeswarm) is
# the same step with OPFORGE_WARM_GRADER=1, its files named *_warm. Each step has its own timeout; logs and results
# under $OUT/wc (tar them).
# Leftover model servers of a step cut off by its timeout are killed before the next step.
# Usage (device tool, repository root, carry .whl): BUDGET_S=540 bash benchmarks/device/warm_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/wc"
T0=$(date +%s)
. benchmarks/device/device_setup.sh > "$OUT/wc/setup.log" 2>&1 || { cat "$OUT/wc/setup.log"; exit 1; }
export OPFORGE_CACHE=${OPFORGE_CACHE:-/tmp/opforge-wc-cache}
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
log() { echo "$(date -u +%T) t=$(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/wc/steps.log"; }
sweep() { pkill -9 -f "[o]pforge\.harness\.(server|grader_child)" 2>/dev/null; pkill -9 -f "[d]istributed\.cli" 2>/dev/null; sleep 1; }
STEPS=${STEPS:-"toolchain batch redteam episodes"}
for s in $STEPS; do
  step=${s%warm}; W=""; WARM=()
  [ "$step" != "$s" ] && { W=_warm; WARM=(OPFORGE_WARM_GRADER=1); }
  case $step in
    toolchain) log toolchain; timeout 150 opforge harness toolchain --device cuda > "$OUT/wc/toolchain.log" 2>&1; log "toolchain rc=$?" ;;
    batch) log "$s"; env "${WARM[@]}" timeout ${BATCH_S:-150} python3 benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16 --out "$OUT/wc/harness_batch$W.json" > "$OUT/wc/harness_batch$W.log" 2>&1; log "$s rc=$?"; sweep ;;
    redteam) N=""; python3 -c "import xdist" 2>/dev/null && N="-n 8"
      log "$s"; env "${WARM[@]}" timeout ${REDTEAM_S:-250} python3 -m pytest -m gpu $N -q -p no:cacheprovider tests/test_grader_redteam_gpu.py tests/test_timing_gpu.py > "$OUT/wc/redteam$W.log" 2>&1; log "$s rc=$?"; sweep ;;
    episodes) T=$(( $(left) - 10 )); log "$s (timeout $T)"
      [ $T -gt 30 ] && env "${WARM[@]}" timeout $T python3 benchmarks/env_episodes.py --device cuda --episodes 64 --out "$OUT/wc/env_episodes$W.json" > "$OUT/wc/env_episodes$W.log" 2>&1; log "$s rc=$?"; sweep ;;
  esac
done
tail -3 "$OUT/wc/redteam.log" 2>/dev/null
log done
