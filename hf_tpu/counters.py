"""torch.compile's counters: graphs captured, XLA programs traced, JAX persistent-cache hits and misses, and
seconds in AOTAutograd and in XLA. Kept below everything that bumps or reads them: runtime.jax() installs
the cache listener when JAX starts, the compiler (graph_compiler.py, compile_cache/) bumps, and
compile.stats() reads."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
# padded_graphs / static_dynamic_graphs: graphs with dynamic sizes run padded to buckets, or kept static
# (bounded.py); program_releases: times every compiled executable was dropped to bound the process's memory
# mappings (program_bound.py); compilations: programs a graph got (traced, or loaded from the executable
# cache), graph_traces: the ones of them traced and lowered here (a warm executable cache traces none)
# eager_programs: XLA programs eager mode ran (xla_options.jit's: every op's, view's, fused-mode graph's and the
# fused optimizer step's; not torch.compile graphs'), the figure for "programs per step"
_counts = {"graphs": 0, "compilations": 0, "graph_traces": 0, "cache_hits": 0, "cache_misses": 0,
           "padded_graphs": 0, "static_dynamic_graphs": 0, "program_releases": 0, "eager_programs": 0}
_times = {"aot_s": 0.0, "xla_s": 0.0}
_listener_installed = False


def bump(key: str, n: int = 1) -> None:
    with _lock:
        _counts[key] += n


def bump_time(key: str, seconds: float) -> None:
    with _lock:
        _times[key] += seconds


def program_ran() -> None:
    """One eager XLA program called (xla_options.jit). No lock: it runs on every eager op, and a count two
    threads bump at the same instant may miss one, which a diagnostic figure can afford. A program called
    inside another's trace (a decomposition's sub-ops) counts at that trace."""
    _counts["eager_programs"] += 1


def count(key: str) -> int:
    return _counts[key]


def snapshot() -> dict[str, Any]:
    """The counts, and the times rounded to 0.1 ms."""
    with _lock:
        return {**_counts, **{k: round(v, 4) for k, v in _times.items()}}


def reset() -> None:
    with _lock:
        for k in _counts:
            _counts[k] = 0
        for k in _times:
            _times[k] = 0.0


def install_cache_listener(jax: Any) -> None:
    """Count JAX persistent-cache hits and misses (every program: compiled graphs and eager per-op ones);
    runtime.jax() installs it when JAX starts, passing the module it is configuring."""
    global _listener_installed
    if _listener_installed:
        return

    def on_event(event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            bump("cache_hits")
        elif event == "/jax/compilation_cache/cache_misses":
            bump("cache_misses")

    jax.monitoring.register_event_listener(on_event)
    _listener_installed = True
