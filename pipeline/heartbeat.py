"""Progress of ``opforge run`` that a log can show: when stdout is not a terminal (no progress bars), a line when
the run and each stage start and end, and a heartbeat line every ``interval_s`` seconds (default 30) with what is
done of what is known, the rate and an ETA.

Read from the run directory only (the files ``opforge status`` reads), by a daemon thread, so it never slows the
run: the stage (``harvest`` until ``seeds/catalog.parquet`` exists, ``compose`` until the first verdict,
``filter`` while verdicts arrive, ``select and publish`` after the last), candidates composed (rows of
``candidates/round-*.parquet``, from their footers) and verdicts given (new lines of ``filter/ledger.jsonl``,
read incrementally). The filter's total is the candidates composed so far (a later round adds to it), so its ETA
is of the rounds composed.

Example lines::

    opforge run: started (target 100, runs/default); a progress line every 30 s
    opforge run: stage harvest started
    opforge run: stage harvest ended after 41 s
    opforge run: [2:30] filter: 412 of 1,500 candidates verdicted (27.5 %), 1.9/s, ETA 9 min 32 s; 210 accepted
    opforge run: finished after 11 min 43 s
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import TextIO


def _dur(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class RunHeartbeat:
    """Context manager: the log lines of the module docstring for the run in ``run_dir`` on ``stream``."""

    def __init__(self, run_dir: str | Path, target: int | None = None, interval_s: float = 30.0,
                 stream: TextIO | None = None, label: str = "opforge run"):
        self.run_dir, self.target, self.interval_s = Path(run_dir), target, interval_s
        self.stream, self.label = stream or sys.stdout, label
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._offset, self._verdicts, self._accepted = 0, 0, 0
        self._stage: str | None = None
        self._stage_t0 = self._t0 = 0.0
        self._rate_at: tuple[float, int] | None = None

    def _say(self, text: str) -> None:
        print(f"{self.label}: {text}", file=self.stream, flush=True)

    def _read_ledger(self) -> None:
        path = self.run_dir / "filter" / "ledger.jsonl"
        try:
            with open(path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # a line being written is read on the next call
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(rec, dict) and "task_id" in rec:
                self._verdicts += 1
                self._accepted += bool(rec.get("accepted"))
        self._offset += end

    def _candidates(self) -> int:
        import pyarrow.parquet as pq

        n = 0
        for p in (self.run_dir / "candidates").glob("round-[0-9][0-9][0-9][0-9].parquet"):
            try:
                n += pq.ParquetFile(p).metadata.num_rows
            except Exception:  # noqa: BLE001 - a file being written: counted next time
                continue
        return n

    def _stage_now(self) -> str:
        if (self.run_dir / "run.json").is_file():
            return "finished"
        if self._verdicts:
            return "filter"
        if (self.run_dir / "seeds" / "catalog.parquet").is_file() or self._candidates():
            return "compose"
        return "harvest"

    def tick(self, beat: bool = True) -> None:
        """Read the run directory; print a stage change and (``beat``) the heartbeat line."""
        self._read_ledger()
        now = time.monotonic()
        stage = self._stage_now()
        if stage != self._stage:
            if self._stage is not None:
                self._say(f"stage {self._stage} ended after {_dur(now - self._stage_t0)}")
            if stage != "finished":
                self._say(f"stage {stage} started")
            self._stage, self._stage_t0 = stage, now
            self._rate_at = (now, self._verdicts)
        if not beat or stage == "finished":
            return
        head = f"[{_dur(now - self._t0)}] {stage}"
        if stage in ("harvest", "compose"):
            n = self._candidates()
            self._say(f"{head}: {n:,} candidates composed" + (f" (target {self.target:,} tasks)" if self.target else ""))
            return
        total = self._candidates()
        t, v = self._rate_at or (now, self._verdicts)
        rate = (self._verdicts - v) / (now - t) if now > t else 0.0
        left = total - self._verdicts
        of = f" of {total:,} candidates composed so far ({100 * self._verdicts / total:.1f} %)" if total else ""
        eta = f", ETA {_dur(left / rate)}" if rate > 0 and left > 0 else ""
        self._say(f"{head}: {self._verdicts:,}{of} verdicted, {rate:.1f}/s{eta}; {self._accepted:,} accepted")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a progress line must never stop the run
                self._say(f"(progress unreadable: {type(exc).__name__}: {exc})")

    def __enter__(self) -> RunHeartbeat:
        self._t0 = time.monotonic()
        self._say(f"started ({f'target {self.target:,}, ' if self.target else ''}{self.run_dir}); "
                  f"a progress line every {self.interval_s:g} s")
        self._offset = 0
        self.tick(beat=False)
        self._thread = threading.Thread(target=self._loop, name="opforge-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.tick(beat=False)
        except Exception:  # noqa: BLE001
            pass
        if self._stage not in (None, "finished"):
            self._say(f"stage {self._stage} ended after {_dur(time.monotonic() - self._stage_t0)}")
        self._say(("finished" if exc[0] is None else "stopped") + f" after {_dur(time.monotonic() - self._t0)}")
