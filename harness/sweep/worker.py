"""Worker processes: reused across entries, one entry at a time each, with a per-entry timeout, a memory cap
(a psutil watchdog on the worker's resident memory) and crash detection. A worker that dies or is killed
costs the row of the phase it was in; `resolve_death` turns that into rows and, when modes remain, a
continuation task that a fresh worker runs.

The worker is `python -m harness.sweep.worker RFD WFD`: a plain subprocess speaking pickled messages over two
pipes (multiprocessing.connection), so its environment (HF_HUB_OFFLINE=1, ...) is set before anything imports.
Messages to the worker: ("run", Task) | ("stop", None). From it: ("ready", info) once imports are done, then
per task ("phase", name), ("row", row), ("cause", fields)..., ("done", rss_bytes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection

from harness.core import errors
from harness.sweep.options import SweepOptions, worker_threads
from harness.sweep.tensor_parallel import TP_MODES

POLL_S = 0.05
# Wall seconds a worker may take to import torch, JAX and Transformers. A sweep run at nice 19 on a loaded machine
# (the full-zoo train run beside five helpers, load 16 on 2 cores) got too little CPU to start within 300 s, and
# after MAX_STARTUP_FAILURES such kills the sweep stopped: HF_TPU_SWEEP_STARTUP_TIMEOUT raises it for such runs.
STARTUP_TIMEOUT_S = float(os.environ.get("HF_TPU_SWEEP_STARTUP_TIMEOUT", "300"))


@dataclass
class Task:
    entry: object
    modes: tuple[str, ...]
    skip_reference: bool = False
    attempt: int = 0


@dataclass
class Death:
    why: str  # crash | timeout | oom
    phase: str | None
    exitcode: int | None = None
    where: str = ""  # a crash's faulthandler dump, shortened (errors.fault_frames)


@dataclass
class Outcome:
    rows: list[dict] = field(default_factory=list)
    death: Death | None = None


BACKEND_PHASES = ("eager", "fused", "compiled", *TP_MODES)  # a death in one is that mode's row
CONTROL_PHASE = "control"  # after a failing row: its control run (harness/sweep/control.py)


def resolve_death(task: Task, rows: list[dict], death: Death, opts: SweepOptions, backend: str = "") -> tuple[list[dict], Task | None]:
    """Rows to add for a dead worker's task, and the continuation task (modes still to run), if any."""
    from harness.sweep.runner import base_row

    fields = errors.death_fields(death.exitcode, death.why)
    if death.phase and death.phase.startswith("train-"):
        # the train phase runs after every inference row was sent: the rest of the train phase is lost (its
        # modes get the death's status: the train phase does not resume mid-way)
        sent = {r["mode"] for r in rows if r.get("phase") == "train"}
        why = {"crash": fields["error_message"] or "worker died", "timeout": f"timeout after {opts.timeout:g} s",
               "oom": "worker passed the memory cap"}[death.why]
        where = f": {death.where}" if death.where else ""
        died_in = death.phase[len("train-"):]
        out = [{**base_row(task.entry, m, opts, backend, "train"),
                "status": death.why if m == died_in else ("baseline_fail" if died_in in ("baseline", "reference")
                                                         else "skipped"),
                **fields, "error_message": f"{why} during {death.phase}{where}"} for m in task.modes if m not in sent]
        return out, None
    done = {r["mode"] for r in rows if r.get("phase", "inference") == "inference"}
    remaining = tuple(m for m in task.modes if m not in done)
    if death.phase in BACKEND_PHASES and death.phase in remaining:
        row = {**base_row(task.entry, death.phase, opts, backend), "status": death.why, **fields}
        if death.where:
            row["error_message"] = f"{row['error_message']}: {death.where}"
        if death.why != "crash":
            row["error_message"] = f"{death.why} after {opts.timeout:g} s" if death.why == "timeout" else (
                "worker passed the memory cap")
        rest = tuple(m for m in remaining if m != death.phase)
        return [row], (replace(task, modes=rest, attempt=task.attempt + 1) if rest else None)
    if death.phase == CONTROL_PHASE:
        # the failing row was sent before its control: only its cause is lost; the other modes run on
        return [], (replace(task, modes=remaining, attempt=task.attempt + 1) if remaining else None)
    if death.phase == "reference" and not task.skip_reference:
        # the float64 reference is an extra; run again without it
        return [], replace(task, modes=remaining, skip_reference=True, attempt=task.attempt + 1)
    # died building or running the CPU baseline: not the backend's fault
    what = {"crash": fields["error_message"] or "worker died", "timeout": f"timeout after {opts.timeout:g} s",
            "oom": "worker passed the memory cap"}[death.why]
    out = []
    for m in remaining:
        out.append({**base_row(task.entry, m, opts, backend), "status": "baseline_fail", **fields,
                    "error_message": f"{what} during {death.phase or 'startup'}"})
    return out, None


def merge_cause(rows: list[dict], payload: dict) -> None:
    """Put a control's ("cause", {mode, cause, control_error}) into the row of that mode already received."""
    fields = {k: v for k, v in payload.items() if k not in ("mode", "phase")}
    phase = payload.get("phase", "inference")
    for row in reversed(rows):
        if row.get("mode") == payload.get("mode") and row.get("phase", "inference") == phase:
            row.update(fields)
            return


def worker_environment(opts: SweepOptions, threads: int | None = None, die_with_parent: bool = False) -> dict:
    """The environment a worker process starts with: this one's, the sweep's (opts.worker_env), its thread
    count, and OpenMP threads that sleep when idle (OMP_WAIT_POLICY=PASSIVE, unless the user set a policy).
    PyTorch's OpenMP threads otherwise spin after each parallel region, and the sweep's CPU work is
    thousands of small ops (the CPU baseline's and float64 reference's steps, the numerics rule over every
    gradient and weight): with 2 threads on this loaded 2-core machine (--jobs 1) the spinning thread took
    the core from the one with work; BartForCausalLM's train phase, a worker's second entry, 4.76 CPU-s
    (15.0 s wall) spinning, 0.77 (4.2 s) passive; `d[torch.isfinite(d)]` on 4096 doubles 1288 -> 40 CPU-us."""
    env = {**os.environ, **opts.worker_env()}
    env["HF_TPU_SWEEP_THREADS"] = str(threads or worker_threads(opts.jobs))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # the local pool's workers die with the sweep (kill -9 included); not under Ray, whose task threads
    # may end before the worker should
    env["HF_TPU_SWEEP_DIE_WITH_PARENT"] = "1" if die_with_parent else "0"
    return env


class Worker:
    """One reusable worker process (the parent's handle)."""

    def __init__(self, opts: SweepOptions, log_path: str | None = None, threads: int | None = None,
                 die_with_parent: bool = False):
        self.opts = opts
        r_parent, w_child = os.pipe()
        r_child, w_parent = os.pipe()
        env = worker_environment(opts, threads, die_with_parent)
        self._log_path = log_path
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.sweep.worker", str(r_child), str(w_child)],
            pass_fds=(r_child, w_child), env=env, stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL,
        )
        os.close(r_child)
        os.close(w_child)
        self.conn_in = Connection(r_parent, writable=False)
        self.conn_out = Connection(w_parent, readable=False)
        self.ready = False
        self.started = time.monotonic()
        self.backend = ""
        self.task: Task | None = None
        self.outcome: Outcome | None = None
        self.phase: str | None = None
        self.deadline = 0.0
        self.entries_run = 0
        self.last_rss = 0
        self._killed_for: str | None = None
        self._ps = None
        self.conn_out.send(("setup", opts))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def busy(self) -> bool:
        return self.task is not None

    def start(self, task: Task) -> None:
        self.task, self.outcome, self.phase = task, Outcome(), None
        self.deadline = time.monotonic() + self.opts.timeout
        self.conn_out.send(("run", task))

    def rss(self) -> int:
        try:
            import psutil

            if self._ps is None:
                self._ps = psutil.Process(self.pid)
            total = self._ps.memory_info().rss
            for child in self._ps.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            return total
        except Exception:  # noqa: BLE001
            return 0

    def watchdog(self, cap: int | None) -> None:
        """Kill a worker past its deadline or memory cap (the reason is kept for the row)."""
        if self._killed_for or not self.alive():
            return
        if not self.ready and time.monotonic() - self.started > STARTUP_TIMEOUT_S:
            self.kill("timeout")
        elif self.busy() and time.monotonic() > self.deadline:
            self.kill("timeout")
        elif cap is not None and self.rss() > cap:
            self.kill("oom")

    def kill(self, why: str) -> None:
        self._killed_for = why
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass

    def receive(self) -> str | None:
        """Read one message. Returns "ready", "done", "dead" or None."""
        try:
            kind, payload = self.conn_in.recv()
        except (EOFError, OSError):
            return self._died()
        if kind == "ready":
            self.ready, self.backend = True, payload.get("backend", "")
            return "ready"
        if kind == "phase":
            self.phase = payload
            if payload in BACKEND_PHASES or payload == CONTROL_PHASE or str(payload).startswith("train-"):  # each gets the whole --timeout budget
                self.deadline = time.monotonic() + self.opts.timeout
        elif kind == "row":
            self.outcome.rows.append(payload)
        elif kind == "cause":
            merge_cause(self.outcome.rows, payload)
        elif kind == "done":
            self.last_rss = int(payload or 0)
            self.entries_run += 1
            self.task = None
            return "done"
        return None

    def _died(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        why = self._killed_for or "crash"
        if self.outcome is None:
            self.outcome = Outcome()
        self.outcome.death = Death(why=why, phase=self.phase, exitcode=code,
                                   where=self._fault() if why == "crash" else "")
        self.close()
        return "dead"

    def _fault(self) -> str:
        """The crash's faulthandler dump from the end of this worker's log (the child enables faulthandler)."""
        if not self._log_path:
            return ""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self._log_path) - 65536))
                return errors.fault_frames(f.read().decode("utf-8", "replace"))
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            self.conn_out.send(("stop", None))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.close()

    def close(self) -> None:
        for c in (self.conn_in, self.conn_out):
            try:
                c.close()
            except OSError:
                pass
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
            self._log = None


def run_task_blocking(worker_factory, worker: Worker | None, task: Task, opts: SweepOptions) -> tuple[list[dict], Worker | None]:
    """Run one entry to completion on a single reusable worker (the Ray executor's path): continuations after
    a death run on a fresh worker. Returns (rows, the worker to reuse or None)."""
    from multiprocessing.connection import wait

    cap = opts.memory_cap_bytes()
    rows: list[dict] = []
    while True:
        if worker is None or not worker.alive():
            worker = worker_factory()
        while not worker.ready:
            if wait([worker.conn_in], timeout=POLL_S):
                state = worker.receive()
                if state == "dead":
                    raise RuntimeError(f"sweep worker failed to start (exit code {worker.proc.returncode})")
            worker.watchdog(cap)
        worker.start(task)
        state = None
        while state not in ("done", "dead"):
            if wait([worker.conn_in], timeout=POLL_S):
                state = worker.receive()
            else:
                worker.watchdog(cap)
        rows.extend(worker.outcome.rows)
        if state == "done":
            return rows, worker
        extra, task = resolve_death(task, worker.outcome.rows, worker.outcome.death, opts, worker.backend)
        rows.extend(extra)
        worker = None
        if task is None:
            return rows, None


# ----------------------------------------------------------------------------------------------- child side
def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the sweep that started it dies (even by kill -9)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def _child_main(rfd: int, wfd: int) -> None:
    import faulthandler

    faulthandler.enable()  # a crash's Python stack in the worker log: the parent names it in the row
    if os.environ.get("HF_TPU_SWEEP_DIE_WITH_PARENT") == "1":
        _die_with_parent()
    conn_in = Connection(rfd, writable=False)
    conn_out = Connection(wfd, readable=False)
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("HF_TPU_SWEEP_THREADS", "1")))
        from harness.sweep.device import get_device
        from harness.sweep.numerics import load_overrides
        from harness.sweep.runner import run_entry
    except BaseException as exc:  # noqa: BLE001
        print(f"sweep worker failed to start: {exc!r}", file=sys.stderr, flush=True)
        raise
    device = None
    overrides = None
    while True:
        try:
            kind, payload = conn_in.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "setup":
            opts: SweepOptions = payload
            device = get_device(opts.device)
            device.setup()
            device.warmup(compiled="compiled" in opts.modes)
            overrides = load_overrides(opts.tolerances)
            try:
                import transformers  # noqa: F401  (warm: a fresh process spends ~2 s importing)
                if not opts.zoo.startswith("test"):
                    import harness.zoo  # noqa: F401
            except ImportError:
                pass
            conn_out.send(("ready", {"pid": os.getpid(), "backend": device.backend_label()}))
            continue
        if kind == "run":
            task: Task = payload
            sent: set[str] = set()

            def emit(k, p, _sent=sent):
                if k == "row":
                    _sent.add((p.get("phase", "inference"), p["mode"]))
                conn_out.send((k, p))

            try:
                run_entry(task.entry, task.modes, opts, device, emit, skip_reference=task.skip_reference,
                          overrides=overrides)
            except BaseException as exc:  # noqa: BLE001  (a harness bug: keep going, say so in the rows)
                from harness.sweep.runner import base_row

                for ph, m in ((ph, m) for ph in opts.phases for m in task.modes):
                    if (ph, m) not in sent:
                        emit("row", {**base_row(task.entry, m, opts, device.backend_label(), ph),
                                     "status": "fail_to_run",
                                     **errors.error_fields(exc),
                                     "error_message": errors.normalise(f"harness error: {exc!r}")})
            rss = 0
            try:
                import psutil

                rss = psutil.Process().memory_info().rss
            except Exception:  # noqa: BLE001
                pass
            conn_out.send(("done", rss))


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
