"""Per-row performance figures shared by both phases: the worker's peak resident memory during a row, and the
warmup/steady split of a sequence of compile counts (TorchTPU's harness: warm up until the compile count is
stable, at most 5 steps; a compile after that is a recompile in steady state)."""

from __future__ import annotations

import math
import statistics

MAX_WARMUP = 5


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so peak_rss_mb() covers this row only."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    """VmHWM of this process (MiB) since reset_peak_rss(); None where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def warmup_steps(counts: list[int | None]) -> int | None:
    """counts[i]: the cumulative compile count after call i+1. The number of calls until the count stopped
    changing (first call i+1 whose count equals the one before it, so i calls warmed up), or None when it
    never did within MAX_WARMUP calls or counts are unknown."""
    if not counts or any(c is None for c in counts):
        return None
    for i in range(1, min(len(counts), MAX_WARMUP + 1)):
        if counts[i] == counts[i - 1]:
            return i
    return None


def perf_fields(counts: list[int | None], steady_from: int | None) -> dict:
    """warmup_steps, steady_compilations and recompiles for a row: `steady_from` is the index in counts of the
    first steady (timed, post-warmup) call; compilations after the warmup calls are steady compilations."""
    w = warmup_steps(counts)
    row: dict = {"warmup_steps": w, "peak_rss_mb": peak_rss_mb()}
    if steady_from is not None and counts and all(c is not None for c in counts) and steady_from < len(counts):
        before = counts[steady_from - 1] if steady_from > 0 else 0
        steady = counts[-1] - before
        row["steady_compilations"] = steady
        row["recompiles"] = "recompiles" if steady > 0 else ""
    return row


def time_fields(times: list[float], warmup: int | None) -> dict:
    """TorchTPU's per-model timings from the seconds of each call/step in order and the warmup count:
    first_run_s (the first call), run_s (median of the post-warmup calls; all calls after the first when the
    compile count is unknown or never stable), warmup_s (the warmup overhead: the warmup calls' seconds beyond
    as many steady calls)."""
    if not times:
        return {}
    w = warmup if warmup is not None and warmup < len(times) else None
    steady = times[w:] if w is not None else times[1:]
    run_s = statistics.median(steady) if steady else math.nan
    row = {"first_run_s": times[0], "run_s": run_s}
    if w is not None:
        row["warmup_s"] = max(0.0, sum(times[:w]) - w * run_s)
    return row
