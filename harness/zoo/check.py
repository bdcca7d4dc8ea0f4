"""`zoo check`: build every selected entry and run it once on CPU, in reusable worker processes.

A worker imports torch/transformers once and runs entries one after another; a crash or hang costs one
entry (the parent kills the worker after the per-entry timeout and starts a fresh one)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from harness.zoo.entry import ZooEntry

RESULT_COLUMNS = ["id", "library", "task", "model_type", "model_class", "ok", "category", "stage", "error",
                  "num_parameters", "num_tensors", "finite", "build_s", "run_s"]
MEMORY_CAP = 6 << 30  # per worker; RLIMIT_DATA covers anonymous mmaps on Linux >= 4.7
RECYCLE_RSS = 3 << 30  # restart a worker whose RSS grew past this (leaks across entries)


@dataclass
class CheckResult:
    id: str
    library: str
    task: str
    model_type: str
    model_class: str
    ok: bool
    category: str = ""
    stage: str = ""
    error: str = ""
    num_parameters: int = 0
    num_tensors: int = 0
    finite: bool = True
    build_s: float = 0.0
    run_s: float = 0.0

    @classmethod
    def failed(cls, entry: ZooEntry, category: str, stage: str, error: str, **kw: Any) -> CheckResult:
        return cls(entry.id, entry.library, entry.task, entry.model_type, entry.model_class, False, category,
                   stage, error, **kw)


def check_entry(entry: ZooEntry, seed: int = 0) -> CheckResult:
    """Build `entry` and run it once on CPU (in this process)."""
    import torch

    from harness.zoo.errors import classify, first_line
    from harness.zoo.outputs import output_tensors

    if not entry.available:
        return CheckResult.failed(entry, "not_available", "resolve", entry.reason)
    stage, t0 = "build", time.perf_counter()
    built = None
    try:
        built = entry.build(seed)
        build_s = time.perf_counter() - t0
        stage, t1 = "forward", time.perf_counter()
        tensors = output_tensors(built.run())
        run_s = time.perf_counter() - t1
        if not tensors:
            return CheckResult.failed(entry, "other", "output", "no floating-point tensor in the output",
                                      num_parameters=built.num_parameters, build_s=round(build_s, 3))
        finite = all(bool(torch.isfinite(t).all()) for t in tensors.values())
        return CheckResult(entry.id, entry.library, entry.task, entry.model_type, entry.model_class, True,
                           num_parameters=built.num_parameters, num_tensors=len(tensors), finite=finite,
                           build_s=round(build_s, 3), run_s=round(run_s, 3))
    except Exception as exc:  # every failure becomes a categorised row
        return CheckResult.failed(entry, classify(exc, getattr(exc, "stage", stage)), getattr(exc, "stage", stage),
                                  first_line(exc), num_parameters=getattr(built, "num_parameters", 0))


def _worker_main(conn: Connection, seed: int) -> None:
    """Worker loop: receive a ZooEntry, send back a CheckResult dict; None ends the loop."""
    import resource

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_CAP, MEMORY_CAP))
    except (ValueError, OSError):
        pass
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    import warnings

    warnings.filterwarnings("ignore")
    while True:
        entry = conn.recv()
        if entry is None:
            return
        try:
            result = check_entry(entry, seed)
        except MemoryError:
            result = CheckResult.failed(entry, "oom", "build", f"memory cap {MEMORY_CAP >> 30} GB hit")
        conn.send((asdict(result), _rss()))


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _Worker:
    def __init__(self, ctx: Any, seed: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, seed), daemon=True)
        self.proc.start()
        child.close()
        self.entry: ZooEntry | None = None
        self.started = 0.0

    def submit(self, entry: ZooEntry) -> None:
        self.entry, self.started = entry, time.monotonic()
        self.conn.send(entry)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        self.kill()


def run_check(entries: Iterable[ZooEntry], *, jobs: int = 1, timeout: float = 120.0, seed: int = 0,
              on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check `entries` in `jobs` worker processes (0: in this process, for debugging and fast tests: a crash
    or hang is not contained); results come back in completion order."""
    todo = list(entries)
    results: list[CheckResult] = []

    def done(r: CheckResult) -> None:
        results.append(r)
        if on_result:
            on_result(r)

    if jobs == 0:
        for e in todo:
            done(check_entry(e, seed))
        return results

    # Not-available entries need no worker.
    for e in [e for e in todo if not e.available]:
        done(CheckResult.failed(e, "not_available", "resolve", e.reason))
    queue = [e for e in todo if e.available]
    # spawn, not fork: the parent has imported torch, and forked torch children can deadlock in thread pools.
    ctx = mp.get_context("spawn")
    workers = [_Worker(ctx, seed) for _ in range(max(1, min(jobs, len(queue))))] if queue else []
    idle = list(workers)
    busy: list[_Worker] = []
    try:
        while queue or busy:
            while idle and queue:
                w = idle.pop()
                w.submit(queue.pop(0))
                busy.append(w)
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=1.0)
            now = time.monotonic()
            for w in list(busy):
                entry = w.entry
                assert entry is not None
                replace = False
                if w.conn in ready or (w.conn.poll() if not w.conn.closed else False):
                    try:
                        row, rss = w.conn.recv()
                        done(CheckResult(**row))
                        replace = rss > RECYCLE_RSS
                    except (EOFError, OSError):
                        done(CheckResult.failed(entry, "crash", "forward", f"worker died (exit {w.proc.exitcode})"))
                        replace = True
                elif w.proc.sentinel in ready or not w.proc.is_alive():
                    w.proc.join(1)
                    code = w.proc.exitcode
                    category = "oom" if code in (-9,) else "crash"
                    done(CheckResult.failed(entry, category, "forward", f"worker died (exit {code})"))
                    replace = True
                elif now - w.started > timeout:
                    done(CheckResult.failed(entry, "timeout", "forward", f"no result after {timeout:.0f} s"))
                    replace = True
                else:
                    continue
                busy.remove(w)
                if replace:
                    w.kill()
                    workers.remove(w)
                    w = _Worker(ctx, seed)
                    workers.append(w)
                idle.append(w)
    finally:
        for w in workers:
            w.stop()
    return results
