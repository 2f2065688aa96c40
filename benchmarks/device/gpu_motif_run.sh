#!/usr/bin/env bash
# `opforge run --device cuda` from an empty run directory (harvest included) with the default composer (motifs
# mined from real models + the random composer with axis roles), then the published rows' headroom figures
# (benchmarks/headroom_bench.py style: roofline_ms, fusion_gain, room over the better of eager and
# torch.compile). The composer sizes for the visible GPU's own profile (opforge run's default). Carry .whl:
#   TARGET=1000 SEED=35 bash benchmarks/device/gpu_motif_run.sh
# Logs and a tarball of the run's records land in $OUT as NAME.log / NAME.tgz (NAME default run; EXTRA adds
# `opforge run` options, SEEDS_CATALOG reuses a harvested catalog, RESUME=1 resumes the run directory a call
# before left on a still-warm machine; FRESH_CACHE=1 gives the run empty Inductor and Triton caches, as on a fresh
# machine: a second run on a warm machine otherwise compiles from the first one's caches, about 4x faster).
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
RUN=${RUN:-/tmp/motifrun}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
[ -n "${RESUME:-}" ] || rm -rf "$RUN"
if [ -n "${FRESH_CACHE:-}" ]; then
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/inductor.XXXXXX) TRITON_CACHE_DIR=$(mktemp -d /tmp/triton.XXXXXX)
    export TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
fi
T0=$(date +%s)
timeout "${LIMIT:-500}" python3 -m opforge.pipeline.cli run --device cuda --target "${TARGET:-1000}" \
    --seed "${SEED:-35}" --out "$RUN" ${ROUND_SIZE:+--round-size $ROUND_SIZE} \
    ${SEEDS_CATALOG:+--seeds-catalog $SEEDS_CATALOG} ${EXTRA:-} 2>&1 | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem|unit|op|model)/s" \
    | tee "$OUT/${NAME:-run}.log"
echo "run wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/${NAME:-run}.log"
# the run's records without the round files, variants and ledger (too large to come back in one file); the
# ledger apart
tar czf "$OUT/${NAME:-run}.tgz" -C "$(dirname "$RUN")" --exclude='*/logs/*' --exclude='*.pkl' --exclude='*/seeds/*' \
    --exclude='*/candidates/*' --exclude='*/variants.jsonl' --exclude='*/ledger.jsonl' "$(basename "$RUN")"
tar czf "$OUT/${NAME:-run}-ledger.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")/filter/ledger.jsonl"
ls -la "$OUT"
exit 0
