"""How a `tpu` tensor holds its data: plain PrivateUse1 tensors with a JAX array behind them.

A tpu tensor is an ordinary `torch.Tensor` (PyTorch's documented pure-Python backend pattern), so
TorchDynamo captures it like any device tensor; its numbers live in a JAX array.

Aliasing is PyTorch's: views share a `Buffer` (one JAX array, the "storage") and address it through an
index array of flat positions, composed as views of views are taken. The payload hangs off the tensor's
UntypedStorage, not the tensor, because PyTorch makes some aliases in C++ without dispatching to us
(`detach`, `squeeze`, `.data`): those share the StorageImpl, so they find the same payload.

PyTorch sees every tpu tensor as contiguous with storage offset 0; view ops therefore arrive expressed in
the source tensor's logical (row-major) frame, which is the frame `as_strided_index` interprets them in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hf_tpu import dtypes


class Buffer:
    """Device memory shared by a tensor and its views; `version` moves on every write.

    The array may come later: a Buffer made with a `loader` calls it on first use, as a CPU tensor over a
    memory-mapped checkpoint reads its pages on first use (see patches._cpu_to_tpu)."""

    __slots__ = ("_array", "_loader", "version")

    def __init__(self, array: Any = None, loader: Callable[[], Any] | None = None) -> None:
        self._array = array
        self._loader = loader
        self.version = 0

    @property
    def array(self) -> Any:
        a = self._array
        if a is None:
            with _load_lock:  # two threads' first uses must not read (and allocate) twice
                if self._array is None:
                    self._array, self._loader = self._loader(), None  # type: ignore[misc]
            a = self._array
        return a

    @array.setter
    def array(self, value: Any) -> None:
        self._array, self._loader = value, None


_load_lock = threading.Lock()


class Payload:
    """What a tensor sees of a Buffer: all of it (index None) or the flat positions in `index`."""

    __slots__ = ("buf", "index", "_cache_version", "_cache")

    def __init__(self, buf: Buffer, index: np.ndarray | None = None) -> None:
        self.buf = buf
        self.index = index
        self._cache_version = -1
        self._cache = None


def _create(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch._C._acc.create_empty_tensor(list(shape), dtype)


def wrap(array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tpu tensor owning `array` (a jax.Array, possibly a tracer)."""
    if dtype is None:
        dtype = dtypes.to_torch(array.dtype)
    t = _create(array.shape, dtype)
    t.untyped_storage()._hf_tpu = Payload(Buffer(array))
    return t


def wrap_lazy(shape: tuple[int, ...], dtype: torch.dtype, loader: Callable[[], Any]) -> torch.Tensor:
    """A new tpu tensor whose array `loader()` makes on first use (it must return that shape and dtype)."""
    t = _create(shape, dtype)
    t.untyped_storage()._hf_tpu = Payload(Buffer(loader=loader))
    return t


def payload(t: torch.Tensor) -> Payload:
    try:
        return t.untyped_storage()._hf_tpu
    except AttributeError:
        raise RuntimeError(
            f"hf_tpu: this {t.device} tensor has no data attached (shape {tuple(t.shape)}); it was made by "
            "a path that bypassed the tpu backend. Please report it with the code that made the tensor."
        ) from None


def storage_identity(t: torch.Tensor) -> int:
    """The identity of the device buffer `t` reads: equal for a tensor, its views and its aliases, as a
    storage's data pointer is for a CPU tensor (a tpu tensor's PyTorch storage has no data pointer).
    Never loads a lazy buffer."""
    return id(payload(t).buf)


def is_tpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def value(t: torch.Tensor) -> Any:
    """The tensor's logical value as a JAX array of its shape."""
    p = payload(t)
    shape = tuple(t.shape)
    if p.index is None:
        a = p.buf.array
        return a if a.shape == shape else a.reshape(shape)
    if p._cache_version != p.buf.version:
        p._cache = p.buf.array.reshape(-1)[p.index.reshape(-1)]
        p._cache_version = p.buf.version
    c = p._cache
    return c.reshape(shape) if c.shape != shape else c


def _flat_positions(p: Payload, numel: int) -> np.ndarray:
    return np.arange(numel, dtype=np.int64) if p.index is None else p.index.reshape(-1)


def assign(t: torch.Tensor, new: Any) -> None:
    """Write `new` (broadcast and cast to t's shape and dtype) into t, and so into every alias of it."""
    jnp = _jnp()
    shape = tuple(t.shape)
    new = jnp.asarray(new)
    want = dtypes.to_jax(t.dtype)
    if new.dtype != want:
        new = new.astype(want)
    if new.shape != shape:
        new = jnp.broadcast_to(new, shape)
    p = payload(t)
    buf = p.buf
    if p.index is None and buf.array.size == new.size:
        buf.array = new.reshape(buf.array.shape) if buf.array.shape != shape else new
    else:
        flat = buf.array.reshape(-1)
        buf.array = flat.at[_flat_positions(p, new.size)].set(new.reshape(-1)).reshape(buf.array.shape)
    buf.version += 1


def replace(t: torch.Tensor, new: Any) -> None:
    """Give t new contents of a possibly different shape (resize_, out= of the wrong size)."""
    fresh = wrap(new, t.dtype)
    t.data = fresh  # shallow-copies size and StorageImpl in C++, so the payload follows


def strided_positions(size: list[int], stride: list[int], offset: int) -> np.ndarray:
    """Row-major element positions that `as_strided(size, stride, offset)` reads, as an array of `size`."""
    idx = np.full([int(s) for s in size], int(offset), dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = int(n)
        idx = idx + (np.arange(int(n), dtype=np.int64) * int(st)).reshape(shape)
    return idx


def as_strided_index(src: torch.Tensor, size: list[int], stride: list[int], offset: int) -> np.ndarray:
    """Flat buffer positions of `src.as_strided(size, stride, offset)`, read in src's logical frame."""
    idx = strided_positions(size, stride, offset)
    p = payload(src)
    base = _flat_positions(p, src.numel())
    if idx.size and (idx.min() < 0 or idx.max() >= base.size):
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset} are out of "
            f"bounds for a tpu tensor of {base.size} elements"
        )
    return base[idx]


def make_view(src: torch.Tensor, size: list[int], index: np.ndarray | None) -> torch.Tensor:
    """A new tensor that aliases src's buffer through `index` (None: the whole buffer, reshaped)."""
    p = payload(src)
    out = _create(size, src.dtype)
    if index is not None and index.size == p.buf.array.size and np.array_equal(
        index.reshape(-1), np.arange(index.size)
    ):
        index = None  # the whole buffer in order: read it without a gather
    out.untyped_storage()._hf_tpu = Payload(p.buf, index)
    return out


def view_reshape(src: torch.Tensor, size: list[int]) -> torch.Tensor:
    p = payload(src)
    idx = None if p.index is None else p.index.reshape(size)
    return make_view(src, size, idx)


def from_cpu(t: torch.Tensor, adopt: bool = False) -> Any:
    """A CPU tensor's value as a JAX array: one copy (jnp.asarray measured two). The copy is made in numpy
    because on XLA:CPU device_put may alias the numpy buffer, which the CPU tensor could later change.
    `adopt=True` is for a buffer nobody else will touch (a tensor just read from a checkpoint): the array
    then shares its memory where XLA can (XLA:CPU, aligned data), and no copy is made. JAX arrays are
    immutable and hf_tpu donates no buffers, so the shared memory is only ever read."""
    from hf_tpu import runtime

    jax = runtime.jax()
    dtypes.check(t.dtype)
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # JAX's own numpy bfloat16

        # torch will not hand numpy a bfloat16 array: move the bits, then view them as ml_dtypes' bfloat16
        host = t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        host = t.contiguous().numpy()
    return jax.device_put(host, may_alias=True) if adopt else jax.device_put(np.array(host, copy=True))


def to_cpu(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """A JAX array's value as a new CPU tensor of `dtype`."""
    a = np.asarray(array)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True)).to(dtype)


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy
