#!/usr/bin/env bash
# A/B(/C/D) of `opforge filter` options, one GPU per side, same tasks at the same time (issue #7), through
# the device tool:
#   carry: .whl runs/seeds runs/reference runs/gpu/cand_h200_1100.parquet
#   AB_SIDES="--workers 14;--workers 18" bash benchmarks/device/gpu_filter_ab.sh
# Side i (i-th ';'-separated argument list of AB_SIDES) runs `opforge filter` of the first AB_N candidates
# on GPU i and CPUs 16i..16i+15 (the single-GPU kind's 16 cores) with those extra arguments, for AB_S
# seconds. Every 5 s the ledger line count of every side is appended to ab_counts.txt (unix time, then one
# count per side). AB_ENVS (optional, ';'-separated like AB_SIDES) gives side i extra environment
# variables (space-separated NAME=VALUE), e.g. AB_ENVS=";PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
# (the sandbox children keep a value set here). AB_TREES (optional, ';'-separated) gives side i another
# version of opforge: a carried tar of its package folders, e.g. made here with
#   git archive -o runs/ab/base.tar BASE task seeds compose filters pipeline harness data_cards
# (carry runs/ab): that side imports opforge from it (PYTHONPATH, ahead of the editable install), its
# sandbox children and Dask workers too; ab_sides.txt names the file each side imports. Each side has its
# own Inductor cache and temporary folder. AB_ROUND names this A/B in the file names (several A/Bs in one
# call). Results: $OUT/ab${AB_ROUND}.tgz.
# Session 7 compared `--compile-threads 4` with 1 this way (AB_SIDES="--compile-threads 1;--compile-threads 4").
set -uo pipefail
. benchmarks/device/device_setup.sh || exit 1
OUT=${OUT:-/tmp/out}
W=${WORK:-/tmp/abwork}
rm -rf "$W"; mkdir -p "$W"
CANDS=${CANDS:-runs/gpu/cand_h200_1100.parquet}
KB=runs/reference/kernelbench.jsonl
IFS=';' read -r -a SIDES <<< "${AB_SIDES:---workers 14;--workers 18}"
IFS=';' read -r -a ENVS <<< "${AB_ENVS:-}"
IFS=';' read -r -a TREES <<< "${AB_TREES:-}"
for i in "${!TREES[@]}"; do  # opforge's package-dir mapping (pyproject.toml), rebuilt from the tar
    [ -n "${TREES[$i]}" ] || continue
    mkdir -p "$W/src$i" "$W/site$i/opforge"
    tar xf "${TREES[$i]}" -C "$W/src$i" || exit 1
    for d in task seeds compose filters pipeline harness data_cards; do ln -s "$W/src$i/$d" "$W/site$i/opforge/$d"; done
    ENVS[$i]="PYTHONPATH=$W/site$i:$PYTHONPATH ${ENVS[$i]:-}"
done
NGPU=$(nvidia-smi -L | wc -l)
[ "${#SIDES[@]}" -le "$NGPU" ] || { echo "AB_SIDES has ${#SIDES[@]} sides, this machine $NGPU GPUs"; exit 1; }
side() {  # GPU $1, extra arguments $2, extra environment $3
    mkdir -p "$W/tmp$1"
    # shellcheck disable=SC2086 - $2 is an argument list, $3 a list of NAME=VALUE
    TMPDIR=$W/tmp$1 CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_CACHE_DIR=$W/cache$1 TRITON_CACHE_DIR=$W/cache$1/triton \
        env $3 timeout "${AB_S:-150}" taskset -c "$(( 16 * $1 ))-$(( 16 * $1 + 15 ))" python3 -m opforge.pipeline.cli \
        filter "$CANDS" --out "$W/f$1" --device cuda --limit "${AB_N:-600}" --timeout-s 60 --kernelbench "$KB" $2 \
        2>&1 | stdbuf -o0 tr "\r" "\n" | grep --line-buffered -v -E "(it|task|block|problem)/s" > "$W/ab_gpu$1.log"
}
for i in "${!SIDES[@]}"; do
    # shellcheck disable=SC2086 - a list of NAME=VALUE
    echo "side $i (GPU $i): ${SIDES[$i]} ${ENVS[$i]:+(env ${ENVS[$i]})} imports $(env ${ENVS[$i]:-} python3 -c \
        'import opforge.filters.runtime as m; print(m.__file__)')"
done | tee "$W/ab_sides.txt"
( while sleep 5; do
      line=$(date +%s)
      for i in "${!SIDES[@]}"; do line="$line $(wc -l 2>/dev/null < "$W/f$i/ledger.jsonl" || echo 0)"; done
      echo "$line"
  done > "$W/ab_counts.txt" ) &
CNT=$!
nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 \
    > "$W/gpu_util.csv" &
SMI=$!
PIDS=()
for i in "${!SIDES[@]}"; do side "$i" "${SIDES[$i]}" "${ENVS[$i]:-}" & PIDS+=($!); done
wait "${PIDS[@]}"
kill $CNT $SMI 2>/dev/null
tail -n 3 "$W/ab_counts.txt"
sleep 3  # sandbox children of a side cut by its timeout notice their parent's death within 1 s
cd "$W" && tar czf "$OUT/ab${AB_ROUND:-}.tgz" ab_sides.txt ab_counts.txt gpu_util.csv ab_gpu*.log f*/ledger.jsonl \
    f*/logs 2>/dev/null
ls -la "$OUT"
exit 0
