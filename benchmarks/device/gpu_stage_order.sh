#!/usr/bin/env bash
# The verdict-identity check of the streamed main job (issue #37): the run gpu_motif_run.sh left in $A on a
# still-warm machine against the same run with its stages one after the other - its rounds composed first
# (`opforge run --compose-rounds N`, N = A's rounds), then `opforge run` filtering them - in run directory $B,
# with A's seed catalog, target, seed and options; then benchmarks/verdict_agreement.py A B. Carry .whl:
#   TARGET=2000 SEED=5 EXTRA='--workers 10' bash benchmarks/device/gpu_stage_order.sh
# (TARGET, SEED and EXTRA as given to gpu_motif_run.sh.) Logs, the agreement report and a tarball of B's records
# land in $OUT as NAME-*.
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
A=${A:-/tmp/motifrun}
B=${B:-/tmp/stagerun}
NAME=${NAME:-stage}
N=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['rounds'])" "$A/run.json") || exit 1
[ -n "${RESUME:-}" ] || rm -rf "$B"
ARGS=(--device cuda --target "${TARGET:-2000}" --seed "${SEED:-5}" --out "$B" --seeds-catalog "$A/seeds/catalog.parquet")
T0=$(date +%s)
timeout "${COMPOSE_LIMIT:-300}" python3 -m opforge.pipeline.cli run "${ARGS[@]}" ${EXTRA:-} --compose-rounds "$N" -q \
    > "$OUT/$NAME-compose.log" 2>&1
echo "compose rounds 0..$((N - 1)): $(( $(date +%s) - T0 )) s" | tee -a "$OUT/$NAME-compose.log"
T0=$(date +%s)
timeout "${LIMIT:-400}" python3 -m opforge.pipeline.cli run "${ARGS[@]}" ${EXTRA:-} -q > "$OUT/$NAME-run.log" 2>&1
echo "run wall s: $(( $(date +%s) - T0 ))" | tee -a "$OUT/$NAME-run.log"
grep -v -E "distributed\.|CancelledError" "$OUT/$NAME-run.log" | tail -4
python3 benchmarks/verdict_agreement.py "$A" "$B" --out "$OUT/$NAME-agreement.json" | head -16
tar czf "$OUT/$NAME.tgz" -C "$(dirname "$B")" --exclude='*/logs/*' --exclude='*.pkl' --exclude='*/seeds/*' \
    --exclude='*/candidates/*' --exclude='*/variants.jsonl' --exclude='*/ledger.jsonl' --exclude='*/hf/*' \
    "$(basename "$B")"
tar czf "$OUT/$NAME-ledger.tgz" -C "$(dirname "$B")" "$(basename "$B")/filter/ledger.jsonl"
exit 0
