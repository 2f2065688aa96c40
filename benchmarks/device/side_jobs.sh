#!/usr/bin/env bash
# GPU measurements on one GPU of a multi-GPU lent machine while the release run holds the others
# (device tool, nvidia-h200-x2: the release on GPU 0 and cores 0-15, these on GPU 1 and cores 16-31; no
# GPU, core or lock file is shared, see docs/gpu-sharing.md):
#   SIDE_GPU=1 SIDE_CPUS=16-31 JOBS="harness env ab" bash benchmarks/device/side_jobs.sh &
# Jobs, one after the other, each under its own timeout, results and logs under $OUT/side/:
#   harness  benchmarks/harness_bench.py --skip-solutions --batch 64 --workers 16 (rewards/min, issue #22)
#   env      benchmarks/env_episodes.py --device cuda --episodes 64 (episodes/min, issue #26)
#   ab       benchmarks/device/engine_ab.sh (old engine vs this tree on the same candidates, issue #23)
#   redteam  pytest -m gpu tests/test_grader_redteam_gpu.py (the grader's CUDA red-team suite, issue #22; with
#            -n REDTEAM_N (8) evaluations at once when pytest-xdist is carried in .whl/)
#   consistency  benchmarks/harness_bench.py --consistency 5 --batch 16 (one honest kernel alone vs in a batch;
#            CONS_ARGS adds arguments, e.g. "--case scale_relu"; CONS_TAG suffixes the result's name; CONS_RESUME
#            names an earlier result of the same settings to go on from)
set -uo pipefail
. benchmarks/device/device_setup.sh > /dev/null || exit 1
OUT=${OUT:-/tmp/out}
S=$OUT/side
mkdir -p "$S"
export CUDA_VISIBLE_DEVICES=${SIDE_GPU:-1}
PIN="taskset -c ${SIDE_CPUS:-16-31}"
filt() { stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op|episode)/s|distributed\."; }
for job in ${JOBS:-harness env ab}; do
    T0=$(date +%s)
    case $job in
        harness)
            timeout "${HARNESS_S:-300}" $PIN python3 benchmarks/harness_bench.py --device cuda --skip-solutions \
                --batch 64 --workers 16 --out "$S/harness_batch.json" 2>&1 | filt > "$S/harness.log" ;;
        env)
            timeout "${ENV_S:-420}" $PIN python3 benchmarks/env_episodes.py --device cuda --episodes 64 \
                --out "$S/env_episodes.json" 2>&1 | filt > "$S/env.log" ;;
        ab)
            CANDS=${CANDS:-runs/ab/cands_1100.parquet} WORK=/tmp/engine_ab OUT="$S" \
                timeout "${AB_TOTAL_S:-600}" $PIN bash benchmarks/device/engine_ab.sh > "$S/ab.log" 2>&1 ;;
        redteam)
            XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n ${REDTEAM_N:-8}"
            timeout "${REDTEAM_S:-400}" $PIN python3 -m pytest -q -m gpu -p no:cacheprovider -rA --durations=15 $XDIST \
                tests/test_grader_redteam_gpu.py > "$S/redteam.log" 2>&1 ;;
        consistency)
            C="$S/harness_consistency${CONS_TAG:-}.json"
            [ -n "${CONS_RESUME:-}" ] && cp "$CONS_RESUME" "$C"
            timeout "${CONS_S:-400}" $PIN python3 benchmarks/harness_bench.py --consistency "${CONS_REPEATS:-5}" \
                --batch 16 --workers 16 ${CONS_ARGS:-} --out "$C" 2>&1 | filt > "$S/consistency${CONS_TAG:-}.log" ;;
        *) echo "unknown job $job" >> "$S/times.txt"; continue ;;
    esac
    echo "$job rc=$? wall_s=$(( $(date +%s) - T0 ))" | tee -a "$S/times.txt"
done
