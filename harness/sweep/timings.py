"""Per-entry timings: where a sweep's time goes, and the order of the next sweep.

The parent times each entry's phases (build, baseline, reference, eager, compiled) from the phase messages
its worker sends; the sweep writes them to `<out>/timings.jsonl` and merges each entry's total into a
timings file kept with the compile caches ($HF_TPU_SWEEP_TIMINGS, else `$HF_TPU_CACHE_DIR/sweep-timings.json`,
else ~/.cache/hf_tpu/sweep-timings.json; HF_TPU_SWEEP_TIMINGS=0: none), which the nightly restores with them. The next sweep runs its
entries longest first by those timings (longest-processing-time scheduling: the long tail starts early,
instead of one worker finishing a 40 s entry while the other idles); entries never timed go first (unknown
cost), then the rest by id, so the order stays deterministic.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "HF_TPU_SWEEP_TIMINGS"


def timings_path() -> Path | None:
    """Where timings persist, or None when HF_TPU_SWEEP_TIMINGS=0 (no ordering, nothing saved)."""
    env = os.environ.get(ENV)
    if env == "0":
        return None
    if env:
        return Path(env).expanduser()
    root = os.environ.get("HF_TPU_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "sweep-timings.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hf_tpu" / "sweep-timings.json"


def _modes_key(modes: tuple[str, ...] | list[str]) -> str:
    return ",".join(sorted(modes))


def load(modes: tuple[str, ...], path: Path | None = None) -> dict[str, float]:
    """entry id -> seconds the last sweep with these modes took for it ({} when unknown or unreadable)."""
    path = path or timings_path()
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
        table = data.get(_modes_key(modes), {})
        return {str(k): float(v) for k, v in table.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def save(modes: tuple[str, ...], seconds: dict[str, float], path: Path | None = None) -> None:
    """Merge this sweep's per-entry seconds into the timings file (best effort: never fails a sweep)."""
    path = path or timings_path()
    if not seconds or path is None:
        return
    try:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        table = data.setdefault(_modes_key(modes), {})
        table.update({k: round(v, 2) for k, v in seconds.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def longest_first(entries: list, previous: dict[str, float]) -> list:
    """Entries never timed first (by id), then the timed ones by decreasing time."""
    if not previous:
        return list(entries)
    unknown = [e for e in entries if e.id not in previous]
    known = sorted((e for e in entries if e.id in previous), key=lambda e: (-previous[e.id], e.id))
    return unknown + known


class PhaseClock:
    """Seconds per phase of each entry in flight, from the phase names its worker reports; with the worker's
    CPU seconds at each report (`cpu_s`), also the CPU seconds per phase (`cpu_phases`): on a shared
    machine wall-clock says how loaded it was, CPU seconds say where the work went."""

    def __init__(self) -> None:
        self._current: dict[str, tuple[str, float]] = {}
        self.phases: dict[str, dict[str, float]] = {}
        self._cpu: dict[str, float] = {}
        self._cpu_at: dict[str, float] = {}  # worker CPU seconds when the current phase began
        self.cpu_phases: dict[str, dict[str, float]] = {}  # entry id -> CPU seconds per phase, once finished
        self._cpu_open: dict[str, dict[str, float]] = {}

    def cpu_start(self, entry_id: str, cpu_s: float | None) -> None:
        if cpu_s is not None:
            self._cpu[entry_id] = cpu_s

    def cpu_stop(self, entry_id: str, cpu_s: float | None) -> None:
        """Record the worker CPU seconds an entry used (as the `cpu` pseudo-phase)."""
        start = self._cpu.pop(entry_id, None)
        if start is not None and cpu_s is not None:
            self.phases.setdefault(entry_id, {})["cpu"] = max(0.0, cpu_s - start)

    def phase(self, entry_id: str, name: str | None, cpu_s: float | None = None) -> None:
        now = time.monotonic()
        prev = self._current.get(entry_id)
        if prev is not None and prev[0] == name:
            return
        if prev is not None:
            table = self.phases.setdefault(entry_id, {})
            table[prev[0]] = table.get(prev[0], 0.0) + now - prev[1]
            start = self._cpu_at.pop(entry_id, None)
            if start is not None and cpu_s is not None:
                cpu = self._cpu_open.setdefault(entry_id, {})
                cpu[prev[0]] = cpu.get(prev[0], 0.0) + max(0.0, cpu_s - start)
        self._current[entry_id] = (name or "startup", now)
        if cpu_s is not None:
            self._cpu_at[entry_id] = cpu_s

    def finish(self, entry_id: str, cpu_s: float | None = None) -> dict[str, float]:
        self.phase(entry_id, "__done__", cpu_s)
        self._current.pop(entry_id, None)
        self._cpu_at.pop(entry_id, None)
        cpu = self._cpu_open.pop(entry_id, {})
        if cpu:
            self.cpu_phases[entry_id] = {k: round(v, 3) for k, v in cpu.items()}
        return {k: round(v, 3) for k, v in self.phases.pop(entry_id, {}).items()}
