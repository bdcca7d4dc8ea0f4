"""The sweep driver: select entries, skip those already written (--resume), run the rest on an executor,
write each entry's rows as it finishes, then consolidate results.csv and the reports."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from harness.schema import SCHEMA_VERSION
from harness.sweep import outputs, timings
from harness.sweep.entries import load_entries
from harness.sweep.executors import get_executor
from harness.sweep.options import SweepOptions
from harness.sweep.progress import Progress
from harness.sweep.results import ResultStore, to_frame, utc_now


@dataclass
class SweepResult:
    out: Path
    df: object
    paths: dict
    ran: int  # entries run by this invocation
    resumed: int  # entries found already written


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-{os.getpid() % 10000:04d}"


def run_sweep(opts: SweepOptions, entries: list | None = None, progress_stream=None) -> SweepResult:
    out = Path(opts.out)
    store = ResultStore(out)
    if entries is None:
        entries = load_entries(opts)
    done = store.completed() if opts.resume else {}
    selected_ids = {e.id for e in entries}
    done = {k: v for k, v in done.items() if k in selected_ids
            and not any(r.get("status") in opts.retry for r in v)}  # --retry: run those again
    todo = [e for e in entries if e.id not in done]
    meta = store.read_run() or {}
    meta.update({"run_id": opts.run_id, "schema_version": SCHEMA_VERSION, "selection": opts.selection(),
                 "entries": len(entries), "host": socket.gethostname()})
    meta.setdefault("started", utc_now())
    meta.setdefault("invocations", []).append({"at": utc_now(), "jobs": opts.jobs, "executor": opts.executor,
                                               "to_run": len(todo), "already_done": len(done)})
    store.write_run(meta)

    # longest first by the previous sweep's timings (timings.py): the long tail starts early
    todo = timings.longest_first(todo, timings.load(tuple(opts.modes)))
    already = [r for rows in done.values() for r in rows]
    took: dict[str, float] = {}
    executor = get_executor(opts, log_dir=out / "workers")
    with Progress(len(entries), already=already, mode=opts.progress, stream=progress_stream) as progress, \
            open(out / "timings.jsonl", "a") as timing_log:
        def on_done(entry, rows, seconds):
            store.write_entry(entry.id, rows)
            took[entry.id] = seconds
            phases = getattr(executor, "phases", {}).pop(entry.id, {})
            record = {"entry_id": entry.id, "seconds": round(seconds, 3), "phases": phases}
            clock = getattr(executor, "clock", None)
            cpu_phases = clock.cpu_phases.pop(entry.id, None) if clock is not None else None
            if cpu_phases:
                record["cpu_phases"] = cpu_phases
            timing_log.write(json.dumps(record) + "\n")
            timing_log.flush()
            progress.entry_done(entry.id, rows, seconds)

        try:
            if todo:
                executor.run(todo, on_done)
        finally:
            timings.save(tuple(opts.modes), took)

    df = to_frame(store.all_rows())
    df = df[df["entry_id"].isin(selected_ids)].reset_index(drop=True)
    paths = outputs.write_reports(df, out, title=opts.run_id)
    meta = store.read_run() or meta
    meta["finished"] = utc_now()
    meta["headline"] = {k: v for k, v in outputs.headline(df).items() if k not in ("statuses", "excluded")}
    store.write_run(meta)
    return SweepResult(out=out, df=df, paths=paths, ran=len(todo), resumed=len(done))
