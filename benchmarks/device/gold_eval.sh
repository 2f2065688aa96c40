#!/usr/bin/env bash
# Issue #57 on the H200: the gold subset's reference solutions through the real user path,
#   opforge harness eval releases/opforge-ops-6k releases/gold-solutions <results> --device cuda
# with the default EvalConfig (hidden shape variants and CUDA graphs on). Resumable across calls:
# `opforge harness eval` keeps results.jsonl (keyed by task, solution files, settings and environment) and
# skips what is recorded, so a call that runs out of time leaves its finished rows and the next call goes on.
# Results live in $GOLD_DIR (default runs/gold: ignored by git, kept on a warm machine; carry it with the
# device tool's `carry: ["runs/gold"]` when the machine is fresh). Each call: eval under `timeout` (EVAL_S,
# default what is left of BUDGET_S = 510 s after the setup, less 60 s), then the record (benchmarks/gold_record.py -> $OUT/gold.json and
# benchmarks/results/h200/gold.json on the machine), the results copied to $OUT/gold/ and the logs tarred.
# WORKERS (default 16): evaluations at once on the GPU, so the ~40 nvcc builds run side by side.
# Usage (device tool, repository root): bash benchmarks/device/gold_eval.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
GOLD_DIR=${GOLD_DIR:-runs/gold}
BUDGET_S=${BUDGET_S:-510}  # the whole call, under the device tool's 600 s per command
mkdir -p "$OUT/gold" "$GOLD_DIR"
T0=$(date +%s)
. benchmarks/device/device_setup.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
export OPFORGE_CACHE=${OPFORGE_CACHE:-/tmp/opforge-gold-cache}
timeout 60 opforge env --json > "$GOLD_DIR/environment.json" 2> "$OUT/gold/env.err"
timeout 120 opforge gold select releases/opforge-ops-6k --out "$OUT/gold/subset.json" > "$OUT/gold/select.log" 2>&1
# what is left of the budget, less 60 s for the record and the tar
EVAL_S=${EVAL_S:-$(( BUDGET_S - ($(date +%s) - T0) - 60 ))}
CMD="opforge harness eval releases/opforge-ops-6k releases/gold-solutions $GOLD_DIR --device cuda --quiet --workers ${WORKERS:-16}"
before=$(wc -l < "$GOLD_DIR/results.jsonl" 2>/dev/null || echo 0)
echo "$(date -u +%FT%TZ) $CMD (timeout ${EVAL_S}s, $before records before)" | tee -a "$OUT/gold/eval.log"
timeout -k 30 "$EVAL_S" $CMD >> "$OUT/gold/eval.log" 2>&1
rc=$?
after=$(wc -l < "$GOLD_DIR/results.jsonl" 2>/dev/null || echo 0)
echo "eval rc=$rc records $before -> $after wall_s=$(( $(date +%s) - T0 ))" | tee -a "$OUT/gold/eval.log"
[ $rc -eq 124 ] && echo "timed out: call again to resume (finished rows are kept)" | tee -a "$OUT/gold/eval.log"
timeout 120 python3 benchmarks/gold_record.py "$GOLD_DIR" --copy-to "$OUT/gold.json" \
    --command "opforge harness eval releases/opforge-ops-6k releases/gold-solutions RESULTS --device cuda" \
    > "$OUT/gold/record.log" 2>&1
tail -30 "$OUT/gold/record.log"
cp "$GOLD_DIR/results.jsonl" "$GOLD_DIR/environment.json" "$OUT/gold/" 2>/dev/null
[ -f "$GOLD_DIR/report.json" ] && cp "$GOLD_DIR/report.json" "$OUT/gold/"
# the build and grader logs the results name, in one tar
python3 - "$GOLD_DIR/results.jsonl" > "$OUT/gold/log_paths.txt" 2>/dev/null <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    for p in (rec.get("logs") or {}).values():
        if isinstance(p, str) and p.startswith("/"):
            print(p)
PY
tar czf "$OUT/gold_logs.tar.gz" --ignore-failed-read -T "$OUT/gold/log_paths.txt" 2>/dev/null
echo "done wall_s=$(( $(date +%s) - T0 ))"
