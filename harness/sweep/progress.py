"""Progress: a rich bar with ETA and live counts per status on a terminal; one line per entry otherwise
(CI logs); nothing with --progress none."""

from __future__ import annotations

import sys
import time
from collections import Counter

from harness.schema import STATUSES

COLORS = {"pass": "green", "fail_accuracy": "yellow", "fail_to_run": "red", "compile_fail": "magenta",
          "timeout": "red", "oom": "red", "crash": "bold red", "baseline_fail": "dim", "not_available": "dim",
          "skipped": "dim"}


class Progress:
    def __init__(self, total: int, already: list[dict] | None = None, mode: str = "auto", stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.counts: Counter[str] = Counter(r["status"] for r in (already or []))
        self.done = len({r["entry_id"] for r in (already or [])})
        self.started = time.monotonic()
        self.done_at_start = self.done
        if mode == "auto":
            mode = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = mode
        self._bar = None
        if mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[counts]}"), console=Console(file=self.stream),
                                     transient=False)
            self._task = self._bar.add_task("sweep", total=total, completed=self.done, counts=self._counts_markup())

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()

    def _counts_markup(self) -> str:
        return " ".join(f"[{COLORS[s]}]{s} {self.counts[s]}[/]" for s in STATUSES if self.counts[s])

    def counts_text(self) -> str:
        return " ".join(f"{s}={self.counts[s]}" for s in STATUSES if self.counts[s])

    def eta_s(self) -> float | None:
        ran = self.done - self.done_at_start
        if ran <= 0:
            return None
        return (time.monotonic() - self.started) / ran * (self.total - self.done)

    def entry_done(self, entry_id: str, rows: list[dict], seconds: float | None = None) -> None:
        self.done += 1
        self.counts.update(r["status"] for r in rows)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, counts=self._counts_markup())
        elif self.mode == "lines":
            eta = self.eta_s()
            statuses = " ".join(f"{r['mode']}={r['status']}" for r in rows)
            took = f" {seconds:.1f}s" if seconds is not None else ""
            eta_s = f" eta {eta:.0f}s" if eta is not None else ""
            print(f"[{self.done}/{self.total}]{eta_s} {entry_id}: {statuses}{took} | {self.counts_text()}",
                  file=self.stream, flush=True)
