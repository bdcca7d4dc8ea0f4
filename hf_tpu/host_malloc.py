"""One glibc malloc arena for the process once the stand-in starts JAX on the host CPU (peak RSS).

Why: glibc gives each thread that allocates its own arena (up to 8 per core), and memory freed into one
arena is reused only by allocations from that arena. On the stand-in, a tpu tensor's numbers are XLA:CPU
buffers allocated by whichever thread runs the program: the main thread in the forward, autograd's device
thread in the backward (PyTorch runs a PrivateUse1 backward on a thread of its own), XLA's pool threads. So
the blocks the forward frees are not reused by the backward, and each arena keeps its free blocks: GPT-2
124M's bfloat16 training step peaked ~0.3 GB higher (3.87-4.00 GB against 3.56-3.68 with one arena; CPU
PyTorch, whose backward runs on the calling thread, 2.83). MALLOC_ARENA_MAX=1 in the environment has the same
effect, but must be set before the process starts; mallopt(M_ARENA_MAX) does it from inside, and counts
only if it runs before the other threads first allocate: glibc latches the limit at the next arena it
would create, and threads keep the arena they already have. JAX starts ~14 threads that allocate as its
backend comes up, so limit_arenas() runs just before JAX is imported (runtime.add_fast_compile_flags).

HF_TPU_MALLOC_ARENA_MAX=<n> picks another limit; 0 leaves glibc's default. A MALLOC_ARENA_MAX set by the
user wins (glibc read it at start). Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import os

ENV = "HF_TPU_MALLOC_ARENA_MAX"
_M_ARENA_MAX = -8  # glibc's malloc.h
_applied: int | None = None  # the limit set by limit_arenas(), None when it set none


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):  # no such name: not glibc
        return False


def limit_arenas() -> int | None:
    """Set glibc's M_ARENA_MAX as ENV says (default 1), once; returns the limit set, or None when none was
    (disabled, the user's MALLOC_ARENA_MAX, not glibc, mallopt refused)."""
    global _applied
    if _applied is not None:
        return _applied
    try:
        limit = int(os.environ.get(ENV, "1"))
    except ValueError:
        raise ValueError(f"{ENV} must be a whole number (0 leaves glibc's default), not "
                         f"{os.environ[ENV]!r}") from None
    if limit <= 0 or "MALLOC_ARENA_MAX" in os.environ or not _is_glibc():
        return None
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if mallopt(_M_ARENA_MAX, limit) != 1:  # mallopt returns 1 on success
        return None
    _applied = limit
    return limit


def applied() -> int | None:
    """The arena limit limit_arenas() set in this process, or None."""
    return _applied
