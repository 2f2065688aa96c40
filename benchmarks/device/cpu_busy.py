"""Sample how busy a set of CPUs is, for the device throughput scripts (issue #7).

    python benchmarks/device/cpu_busy.py --cpus 0-15 --every 2 --out cpu_busy.csv

Every ``--every`` seconds appends one CSV row: unix time, and the busy share (0-1) of the listed CPUs
together over the last interval, from ``/proc/stat`` (busy = all jiffies except idle and iowait). Runs until
killed.
"""

from __future__ import annotations

import argparse
import time


def parse_cpus(spec: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]."""
    cpus: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus += list(range(int(lo), int(hi or lo) + 1))
    return cpus


def read_jiffies(cpus: list[int]) -> tuple[int, int]:
    """(busy, total) jiffies summed over ``cpus`` since boot."""
    busy = total = 0
    wanted = {f"cpu{c}" for c in cpus}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *vals = line.split()
            if name in wanted:
                nums = [int(v) for v in vals[:8]]
                idle = nums[3] + nums[4]
                busy += sum(nums) - idle
                total += sum(nums)
    return busy, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpus", required=True)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cpus = parse_cpus(args.cpus)
    last = read_jiffies(cpus)
    with open(args.out, "a") as fh:
        while True:
            time.sleep(args.every)
            now = read_jiffies(cpus)
            share = (now[0] - last[0]) / max(1, now[1] - last[1])
            fh.write(f"{time.time():.1f},{share:.3f}\n")
            fh.flush()
            last = now


if __name__ == "__main__":
    main()
