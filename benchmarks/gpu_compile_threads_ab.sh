#!/usr/bin/env bash
# A/B of Inductor's compile_threads per sandbox on a two-GPU machine (issue #7), through the device tool:
#   carry: .whl runs/seeds runs/reference runs/gpu/cand_h200_1100.parquet
#   bash benchmarks/gpu_compile_threads_ab.sh
# `opforge filter` of the same first AB_N candidates at once on GPU 0 (CPUs 0-15, --compile-threads 1, the
# default) and GPU 1 (CPUs 16-31, --compile-threads AB_THREADS), WORKERS sandboxes each, for AB_S seconds;
# ledger line counts every 5 s (ab_counts.txt: time, GPU 0 verdicts, GPU 1 verdicts). Each side has its
# own Inductor cache and lock folder. Results: $OUT/ab.tgz.
set -uo pipefail
. benchmarks/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=${WORK:-/tmp/abwork}
rm -rf "$W"; mkdir -p "$W"
CANDS=${CANDS:-runs/gpu/cand_h200_1100.parquet}
KB=runs/reference/kernelbench.jsonl
side() {  # GPU $1, CPUs $2, compile threads $3
    mkdir -p "$W/tmp$1"
    TMPDIR=$W/tmp$1 CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_CACHE_DIR=$W/cache$1 TRITON_CACHE_DIR=$W/cache$1/triton \
        timeout "${AB_S:-150}" taskset -c "$2" python3 -m opforge.pipeline.cli filter "$CANDS" --out "$W/f$1" \
        --device cuda --workers "${WORKERS:-14}" --limit "${AB_N:-600}" --timeout-s 60 --kernelbench "$KB" \
        --compile-threads "$3" 2>&1 | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s" \
        > "$W/ab_gpu$1.log"
}
( while sleep 5; do
      echo "$(date +%s) $(wc -l < "$W/f0/ledger.jsonl" 2>/dev/null || echo 0) $(wc -l < "$W/f1/ledger.jsonl" 2>/dev/null || echo 0)"
  done > "$W/ab_counts.txt" ) &
CNT=$!
side 0 0-15 1 &
A=$!
side 1 16-31 "${AB_THREADS:-4}"
wait $A
kill $CNT 2>/dev/null
tail -n 3 "$W/ab_counts.txt"
sleep 3
cd "$W" && tar czf "$OUT/ab.tgz" ab_counts.txt ab_gpu0.log ab_gpu1.log f0/ledger.jsonl f1/ledger.jsonl 2>/dev/null
ls -la "$OUT"
exit 0
