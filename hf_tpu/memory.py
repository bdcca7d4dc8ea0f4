"""Device memory as torch.accelerator reports it: the bytes of the JAX arrays that live tpu tensors hold.

A tpu tensor's numbers live in a JAX array held by its Buffer (tensor.py); views and clones may share one
array (JAX arrays are immutable), so memory is counted per distinct array, from the moment a Buffer holds
it until the last Buffer holding it lets go. Arrays that no tensor holds (an op's temporaries, RNG keys,
constants inside compiled programs) are not tensors' memory, as a CUDA caching allocator does not count a
kernel's scratch space; tracers (inside traced programs) are no memory at all. The peak is the largest
`current` since the last reset, as in torch.cuda.max_memory_allocated."""

from __future__ import annotations

import math
import threading
from typing import Any

_lock = threading.Lock()
_acquire, _release = _lock.acquire, _lock.release  # nothing between them can raise
_prod = math.prod
_live: dict[int, list[int]] = {}  # id(array) -> [Buffers holding it, its bytes]
_array_type: type | None = None  # jax's concrete array class, learnt from the first array held
# bytes: current, peak, ever allocated, ever freed; the same four as counts of arrays
_stats = [0, 0, 0, 0, 0, 0, 0, 0]


def _is_device_array(kind: type) -> bool:
    global _array_type
    if _array_type is None:
        import sys

        jax = sys.modules.get("jax")
        if jax is None or kind.__name__ != "ArrayImpl" or not issubclass(kind, jax.Array):
            return False
        _array_type = kind
        return True
    return False


def hold(array: Any, shape: tuple[int, ...]) -> None:
    """A Buffer now holds `array`, of `shape` (called for every tpu tensor made, so kept cheap: jax's
    `nbytes` alone would cost more than the rest of this function)."""
    kind = type(array)
    if kind is not _array_type and not _is_device_array(kind):
        return  # a tracer, a pending value, None
    key = id(array)
    n = _prod(shape) * array.dtype.itemsize
    _acquire()  # not `with _lock`: its protocol costs as much again, on every op
    entry = _live.get(key)
    if entry is not None:
        entry[0] += 1
    else:
        _live[key] = [1, n]
        s = _stats
        s[0] += n
        s[2] += n
        s[4] += 1
        s[6] += 1
        if s[0] > s[1]:
            s[1] = s[0]
        if s[4] > s[5]:
            s[5] = s[4]
    _release()


def release(array: Any) -> None:
    """A Buffer let go of `array` (it died, or holds a new array now)."""
    if type(array) is not _array_type:
        return
    key = id(array)
    _acquire()
    entry = _live.get(key)
    if entry is not None:
        entry[0] -= 1
        if not entry[0]:
            del _live[key]
            s = _stats
            s[0] -= entry[1]
            s[3] += entry[1]
            s[4] -= 1
            s[7] += 1
    _release()


def allocated() -> int:
    """Bytes held by live tpu tensors now."""
    return _stats[0]


def max_allocated() -> int:
    """The most bytes live tpu tensors held at once since the process started or the last peak reset."""
    return _stats[1]


def stats() -> tuple[int, int, int, int, int, int, int, int]:
    """(current, peak, allocated, freed) bytes, then the same four counting arrays."""
    with _lock:
        return tuple(_stats)  # type: ignore[return-value]


def reset_peak() -> None:
    with _lock:
        _stats[1] = _stats[0]
        _stats[5] = _stats[4]


def reset_accumulated() -> None:
    with _lock:
        _stats[2] = _stats[3] = 0
        _stats[6] = _stats[7] = 0
