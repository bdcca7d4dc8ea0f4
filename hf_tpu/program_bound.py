"""A bound on the XLA executables one process keeps alive.

Every program XLA compiles for the CPU maps its code and data into the process (about 6 memory mappings per
executable, measured with jax 0.10.2: 300 one-op programs took /proc/self/maps from 423 to 2,288 lines), and
JAX keeps every executable it has compiled or loaded from its disk cache for the life of the function that
owns it. Eager mode owns one function per (op, static arguments) (op_jit.py), specialised to every shape it
meets, so a long eager program that sees many distinct shapes (the OpInfo parity run: ~3,000 pairs) reaches
the kernel's limit on mappings per process (vm.max_map_count, 65,530 by default); mmap then fails inside
XLA and the process dies with a segmentation fault, at whichever op happens to be compiling.

The bound: JAX reports every executable it obtains (a backend compile, or a hit of its persistent cache).
Every CHECK_EVERY of them the next eager op (a safe point: no trace in progress) counts the process's
mappings, and above FRACTION of vm.max_map_count drops every compiled executable with jax.clear_caches().
The functions themselves stay valid: each recompiles (or reloads from the disk cache) on its next call, so
the cost is a recompile of what is still in use, never a wrong result. HF_TPU_MAX_MAPS_FRACTION overrides
FRACTION (0 disables the bound).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from hf_tpu import counters

CHECK_EVERY = 64
FRACTION = float(os.environ.get("HF_TPU_MAX_MAPS_FRACTION", "0.5"))
_lock = threading.Lock()
_loaded = 0  # executables obtained since the last check
due = False  # read on every eager op (eager_functional.run_functional): a plain module attribute, cheap to test
_stats = {"checks": 0, "releases": 0, "maps_before_last_release": 0, "maps_after_last_release": 0}
_limit_override: int | None = None
# called after every release: caches of executables outside JAX's own (executable_cache.py) drop theirs too
on_release: list[Callable[[], None]] = []


def map_limit() -> int:
    """The kernel's limit on memory mappings per process."""
    if _limit_override is not None:
        return _limit_override
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux: nothing to bound
        return 0


def map_count() -> int:
    """The process's memory mappings now (0 where /proc is not available)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def set_limit(maps: int | None) -> None:
    """Bound on mappings to act at (FRACTION of it), instead of vm.max_map_count; None restores it. For tests."""
    global _limit_override
    _limit_override = maps


def stats() -> dict[str, int]:
    return dict(_stats)


def note_executable(n: int = 1) -> None:
    """Called from JAX's monitoring listener for each executable obtained; may run on any thread."""
    global _loaded, due
    with _lock:
        _loaded += n
        if _loaded >= CHECK_EVERY:
            due = True


def check(jax: Any) -> bool:
    """At a safe point: release every compiled executable if the mappings are above the bound. True if it did."""
    global _loaded, due
    with _lock:
        due = False
        _loaded = 0
    limit = map_limit()
    if FRACTION <= 0 or limit <= 0:
        return False
    _stats["checks"] += 1
    before = map_count()
    if before < FRACTION * limit:
        return False
    from jax._src import core  # a trace in progress still needs its caches: try again at the next check

    if not core.trace_state_clean():
        return False
    jax.clear_caches()
    for release in on_release:
        release()
    _stats["releases"] += 1
    _stats["maps_before_last_release"] = before
    _stats["maps_after_last_release"] = map_count()
    counters.bump("program_releases")
    return True


def install_listener(jax: Any) -> None:
    """Count executables JAX compiles or loads (runtime.jax() installs it once, with the module it configures)."""
    from jax._src import dispatch

    def on_duration(event: str, duration: float, **_: Any) -> None:
        if event == dispatch.BACKEND_COMPILE_EVENT:
            note_executable()

    def on_event(event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":  # loaded from disk: mapped all the same
            note_executable()

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
