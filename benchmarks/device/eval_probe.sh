#!/usr/bin/env bash
# One CUDA evaluation with the grader in its own process, then one with it in the caller's (eval_probe.py);
# DUMP_AT seconds into each, a state dump under $OUT/probe/<mode>/: process tree, GPU lock and budget files,
# nvidia-smi, then SIGABRT to every opforge process (PYTHONFAULTHANDLER prints each one's Python stacks into
# its log). Usage: MODES="child in-process" CASES="harness redteam" DUMP_AT=150 bash benchmarks/device/eval_probe.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
. benchmarks/device/device_setup.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
export PYTHONFAULTHANDLER=1
for mode in ${MODES:-child in-process}; do
  for case in ${CASES:-harness}; do
    P=$OUT/probe/$mode-$case
    mkdir -p "$P"
    flag=""; [ "$mode" = in-process ] && flag=--in-process
    python3 benchmarks/device/eval_probe.py --work "$P/work" $flag --case "$case" --repeat "${REPEAT:-1}" \
        > "$P/probe.log" 2>&1 &
    PID=$!
    T0=$(date +%s)
    while kill -0 $PID 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt "${DUMP_AT:-150}" ]; do sleep 1; done
    if kill -0 $PID 2>/dev/null; then
        ps -eo pid,ppid,pgid,stat,etimes,rss,args --forest > "$P/ps.txt"
        for f in /tmp/opforge-gpu-* /tmp/.opforge-gpu-*; do [ -e "$f" ] && { echo "== $f"; cat "$f"; echo; }; done > "$P/locks.txt" 2>&1
        ls -la /tmp > "$P/tmp_ls.txt"
        nvidia-smi > "$P/smi.txt" 2>&1
        pkill -ABRT -f "eval_probe.py|opforge\." ; sleep 3; pkill -KILL -f "eval_probe.py|opforge\."
    fi
    wait $PID
    echo "$mode $case rc=$? wall_s=$(( $(date +%s) - T0 ))" | tee -a "$OUT/probe/times.txt"
    # the servers' and the grader process's logs (Python stacks included) beside probe.log: the device tool
    # brings back no folder deeper than $OUT/probe/<mode-case>/
    for f in "$P"/work/eval*/*.log /tmp/opforge-grader-*/grade.log; do
        [ -e "$f" ] && cp "$f" "$P/log_$(basename "$(dirname "$f")")_$(basename "$f")"
    done
    rm -rf "$P/work" /tmp/opforge-grader-*
  done
done
