"""Executors: how the entries' tasks are run. `inline`: in this process (debugging only). `local`: a pool of --jobs reusable worker processes on this
machine. `ray`: one Ray task per entry on an existing cluster (or a local `ray.init()`), each task running its
entry in a reusable worker subprocess with the same timeout, memory cap and crash handling."""

from __future__ import annotations

import collections
import os
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

from harness.sweep.options import SweepOptions
from harness.sweep.timings import PhaseClock
from harness.sweep.worker import POLL_S, Task, Worker, resolve_death, run_task_blocking

OnDone = Callable[[object, list[dict], float], None]  # (entry, rows, seconds)
MAX_STARTUP_FAILURES = 3


class WorkerStartupError(RuntimeError):
    pass


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) a worker has used so far: an entry's cost independent of how loaded the
    machine is (wall-clock on a shared machine is not)."""
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except Exception:  # noqa: BLE001
        return None


class LocalExecutor:
    def __init__(self, opts: SweepOptions, log_dir: Path | None = None):
        self.opts = opts
        self.log_dir = log_dir
        self._n = 0
        self.workers_started = 0
        self.clock = PhaseClock()
        self.phases: dict[str, dict[str, float]] = {}  # entry id -> seconds per phase, once finished

    def _spawn(self) -> Worker:
        self._n += 1
        self.workers_started += 1
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = str(self.log_dir / f"worker-{self._n:03d}.log")
        return Worker(self.opts, log_path=log, die_with_parent=True)

    def run(self, entries: list, on_done: OnDone) -> None:
        opts = self.opts
        cap = opts.memory_cap_bytes()
        queue = collections.deque(Task(e, tuple(opts.modes)) for e in entries)
        partial: dict[str, list[dict]] = {}
        started: dict[str, float] = {}
        workers: list[Worker] = [self._spawn() for _ in range(min(opts.jobs, len(queue)))]
        startup_failures = 0

        def finish(task: Task, rows: list[dict], cpu_s: float | None = None) -> None:
            eid = task.entry.id
            self.phases[eid] = self.clock.finish(eid, cpu_s)
            allrows = partial.pop(eid, []) + rows
            on_done(task.entry, allrows, time.monotonic() - started.pop(eid, time.monotonic()))

        try:
            while queue or any(w.busy() for w in workers):
                for w in workers:
                    if w.ready and not w.busy() and queue:
                        task = queue.popleft()
                        started.setdefault(task.entry.id, time.monotonic())
                        cpu = _cpu_seconds(w.pid)
                        self.clock.phase(task.entry.id, "dispatch", cpu)
                        self.clock.cpu_start(task.entry.id, cpu)
                        w.start(task)
                conns = {w.conn_in: w for w in workers}
                for conn in wait(list(conns), timeout=POLL_S):
                    w = conns[conn]
                    task = w.task
                    state = w.receive()
                    if task is not None and state is None and w.phase:
                        self.clock.phase(task.entry.id, w.phase, _cpu_seconds(w.pid))
                    if state == "ready":
                        startup_failures = 0
                    elif state == "done":
                        cpu = _cpu_seconds(w.pid)
                        self.clock.cpu_stop(task.entry.id, cpu)
                        finish(task, w.outcome.rows, cpu)
                        if w.entries_run >= opts.max_entries_per_worker or (cap and w.last_rss > 0.6 * cap):
                            w.stop()  # recycle: leaked caches and memory go with the process
                            workers[workers.index(w)] = self._spawn()
                    elif state == "dead":
                        if task is None:
                            startup_failures += 1
                            if startup_failures >= MAX_STARTUP_FAILURES:
                                raise WorkerStartupError(self._startup_message(w))
                        else:
                            rows, cont = resolve_death(task, w.outcome.rows, w.outcome.death, opts, w.backend)
                            partial.setdefault(task.entry.id, []).extend(w.outcome.rows + rows)
                            if cont is not None:
                                queue.appendleft(cont)
                            else:
                                finish(task, [])
                        workers.remove(w)
                        if queue or len(workers) < 1:
                            workers.append(self._spawn())
                for w in workers:
                    w.watchdog(cap)
        finally:
            for w in workers:
                if w.alive():
                    w.kill("stop")
                    w.proc.wait()
                w.close()

    def _startup_message(self, w: Worker) -> str:
        tail = ""
        if self.log_dir is not None:
            logs = sorted(self.log_dir.glob("worker-*.log"))
            if logs:
                tail = "\n" + "\n".join(logs[-1].read_text(errors="replace").splitlines()[-15:])
        return f"sweep workers fail to start (exit code {w.proc.returncode}){tail}"


# ------------------------------------------------------------------------------------------------------ ray
_RAY_WORKER: Worker | None = None


def _ray_run_entry(task: Task, opts: SweepOptions) -> list[dict]:
    """Body of the Ray task: the Ray worker process keeps one sweep worker subprocess across tasks."""
    global _RAY_WORKER

    def factory() -> Worker:
        log = os.path.join(tempfile.gettempdir(), f"hf-tpu-sweep-ray-{os.getpid()}.log")
        return Worker(opts, log_path=log, threads=1)

    rows, _RAY_WORKER = run_task_blocking(factory, _RAY_WORKER, task, opts)
    return rows


class RayExecutor:
    def __init__(self, opts: SweepOptions, log_dir: Path | None = None):
        self.opts = opts

    def run(self, entries: list, on_done: OnDone) -> None:
        import ray

        from harness.sweep.runner import base_row

        opts = self.opts
        if not ray.is_initialized():
            if opts.ray_address:
                ray.init(address=opts.ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=opts.jobs, log_to_driver=False, include_dashboard=False)
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_run_entry)
        pending = {}
        for e in entries:
            pending[remote.remote(Task(e, tuple(opts.modes)), opts)] = (e, time.monotonic())
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                entry, t0 = pending.pop(ref)
                try:
                    rows = ray.get(ref)
                except Exception as exc:  # noqa: BLE001  (the Ray task itself died)
                    msg = f"ray task failed: {type(exc).__name__}"
                    rows = [{**base_row(entry, m, opts, ""), "status": "crash", "error_type": type(exc).__name__,
                             "error_message": msg} for m in opts.modes]
                on_done(entry, rows, time.monotonic() - t0)


class InlineExecutor:
    """Entries run in this process, one after another: no isolation, no timeout or memory cap. For debugging
    the harness (a debugger sees everything) and for fast tests of what does not need isolation."""

    def __init__(self, opts: SweepOptions, log_dir: Path | None = None):
        self.opts = opts

    def run(self, entries: list, on_done: OnDone) -> None:
        from harness.sweep.device import get_device
        from harness.sweep.numerics import load_overrides
        from harness.sweep.runner import run_entry
        from harness.sweep.worker import merge_cause

        device = get_device(self.opts.device)
        device.setup()
        overrides = load_overrides(self.opts.tolerances)
        for e in entries:
            t0 = time.monotonic()
            rows: list[dict] = []

            def emit(kind, payload, rows=rows):
                if kind == "row":
                    rows.append(payload)
                elif kind == "cause":
                    merge_cause(rows, payload)

            run_entry(e, tuple(self.opts.modes), self.opts, device, emit, overrides=overrides)
            on_done(e, rows, time.monotonic() - t0)


def get_executor(opts: SweepOptions, log_dir: Path | None = None):
    if opts.executor == "ray":
        return RayExecutor(opts, log_dir)
    if opts.executor == "inline":
        return InlineExecutor(opts, log_dir)
    return LocalExecutor(opts, log_dir)
