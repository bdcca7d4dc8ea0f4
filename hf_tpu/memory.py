"""Device memory as torch.accelerator reports it: the bytes of the JAX arrays that live tpu tensors hold.

A tpu tensor's numbers live in a JAX array held by its Buffer (tensor.py); views and clones may share one
array (JAX arrays are immutable), so memory is counted per distinct array, from the moment a Buffer holds
it until the last Buffer holding it lets go. Arrays that no tensor holds (an op's temporaries, RNG keys,
constants inside compiled programs) are not tensors' memory, as a CUDA caching allocator does not count a
kernel's scratch space; tracers (inside traced programs) are no memory at all. The peak is the largest
`current` since the last reset, as in torch.cuda.max_memory_allocated.

With several tpu devices (devices.py) each device has its own figures, counted from the JAX device its
arrays live on; the functions without an index give the sum over devices."""

from __future__ import annotations

import math
import threading
from typing import Any

from hf_tpu import devices

_lock = threading.Lock()
_acquire, _release = _lock.acquire, _lock.release  # nothing between them can raise
_prod = math.prod
_live: dict[int, list[int]] = {}  # id(array) -> [Buffers holding it, its bytes, its device's index]
_array_type: type | None = None  # jax's concrete array class, learnt from the first array held
# per device: bytes current, peak, ever allocated, ever freed; the same four as counts of arrays
_by_device = [[0, 0, 0, 0, 0, 0, 0, 0] for _ in range(devices.COUNT)]
_stats = _by_device[0]
_MULTI = devices.MULTI


def _device_index(array: Any) -> int:
    # JAX numbers the CPU devices behind tpu:0..N-1 0..N-1 (tensor.jax_devices), so its id is the index
    try:
        return array.sharding._device.id
    except AttributeError:
        return 0


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
        index = _device_index(array) if _MULTI else 0
        _live[key] = [1, n, index]
        s = _by_device[index]
        s[0] += n
        s[2] += n
        s[4] += 1
        s[6] += 1
        if s[0] > s[1]:
            s[1] = s[0]
        if s[4] > s[5]:
            s[5] = s[4]
    _release()


def holders(array: Any) -> int:
    """How many Buffers hold `array` now (0: none does). An array held by one Buffer alone may be donated to
    a program that overwrites that Buffer (optim_lowerings.py): no other tensor reads it afterwards."""
    entry = _live.get(id(array))
    return entry[0] if entry is not None else 0


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
            s = _by_device[entry[2]]
            s[0] -= entry[1]
            s[3] += entry[1]
            s[4] -= 1
            s[7] += 1
    _release()


def hold_bytes(n: int, index: int = 0) -> None:
    """Memory a tensor's numbers occupy outside any JAX array (a weight's packed copy, packed_weights.py, which
    replaces its array), counted as one allocation."""
    with _lock:
        s = _by_device[index]
        s[0] += n
        s[2] += n
        s[4] += 1
        s[6] += 1
        s[1], s[5] = max(s[1], s[0]), max(s[5], s[4])


def release_bytes(n: int, index: int = 0) -> None:
    """hold_bytes' memory freed."""
    with _lock:
        s = _by_device[index]
        s[0] -= n
        s[3] += n
        s[4] -= 1
        s[7] += 1


def _selected(index: int | None) -> list[list[int]]:
    return _by_device if index is None else [_by_device[devices.check_index(index)]]


def allocated(index: int | None = None) -> int:
    """Bytes held by live tpu tensors now, on device `index` (None: all devices)."""
    return sum(s[0] for s in _selected(index))


def max_allocated(index: int | None = None) -> int:
    """The most bytes live tpu tensors held at once since the process started or the last peak reset, on
    device `index` (None: the sum of the devices' peaks)."""
    return sum(s[1] for s in _selected(index))


def stats(index: int | None = None) -> tuple[int, int, int, int, int, int, int, int]:
    """(current, peak, allocated, freed) bytes, then the same four counting arrays, of device `index`
    (None: summed over devices)."""
    with _lock:
        return tuple(sum(s[i] for s in _selected(index)) for i in range(8))  # type: ignore[return-value]


def reset_peak(index: int | None = None) -> None:
    with _lock:
        for s in _selected(index):
            s[1] = s[0]
            s[5] = s[4]


def reset_accumulated(index: int | None = None) -> None:
    with _lock:
        for s in _selected(index):
            s[2] = s[3] = 0
            s[6] = s[7] = 0
