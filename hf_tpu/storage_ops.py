"""Eager ops that make or fill storage rather than compute: `empty` (zeros made lazily), copies between tpu
and CPU, `resize_`, `set_`, `*_like`/`new_*` factories asked for another device, and the resizing of a
tpu storage (`untyped_storage().resize_`, which FSDP2 uses to free and re-allocate unsharded parameters).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from hf_tpu import devices, dtypes, float8, fused, runtime
from hf_tpu import host_copy
from hf_tpu import tensor as T
from hf_tpu.eager_functional import check_device, run_functional
from hf_tpu.op_dtypes import map_args
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _zeros(size: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """`empty`: zeros made only if something reads them before a write replaces them (`to("tpu")` is an
    `empty` then a `copy_`, so a move never allocates the zeros)."""
    dtype = dtypes.check(dtype or torch.get_default_dtype())
    shape = tuple(int(s) for s in size)
    jdt = dtypes.to_jax(dtype)
    return T.wrap_lazy(shape, dtype, lambda: float8.zeros(shape, jdt))


@lowers(aten.empty.memory_format, kind="eager")
def empty(size: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> torch.Tensor:
    check_device(device)
    return _zeros(size, dtype)


@lowers(aten.empty_strided.default, kind="eager")
def empty_strided(size: Any, stride: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> torch.Tensor:
    check_device(device)
    return _zeros(size, dtype)


_MULTI = devices.MULTI


@lowers(aten._copy_from.default, kind="eager")
def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if dst.device.type == "tpu":
        if src.device.type == "tpu":
            if _MULTI and src.device != dst.device:  # tpu:i -> tpu:j: a transfer between JAX devices
                T.assign(dst, _moved(T.value(src), dst))
            elif not (fused.ACTIVE and T.defer_write(dst, src)):
                T.assign(dst, T.value(src))
        else:
            T.assign(dst, host_copy.from_cpu(src, index=dst.device.index if _MULTI else None))
        return dst
    # src broadcast to dst's shape keeps its own (value's); the same number of elements is the same order
    host_copy.copy_to_cpu(T.row_major(src) if src.numel() == dst.numel() else T.value(src), src.dtype, dst)
    return dst


# `_to_copy` (`x.to(dtype)`, autocast's casts) between tpu tensors on one device: a dtype conversion, run as a
# planned functional op (the `_to_copy` lowering, plans.py) instead of PyTorch's composite kernel, which makes
# an `empty` and then a `copy_` (two trips through the Python fallback, then a cast program with static
# arguments): a bf16 autocast training step casts every matmul's operands and their gradients, ~500 casts a
# GPT-2 step. The same cast (float8.cast) either way. Everything else (a move to CPU or another device, pinned
# memory, sparse layouts, channels-last, a copy without a dtype change, float8 and complex operands) keeps the
# composite kernel, called as it was.
DIRECT_TO_COPY = True  # tests and benchmarks switch it to compare with the composite path
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_PLAIN_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _direct_cast(x: torch.Tensor, dtype: Any, layout: Any, device: Any, pin_memory: Any,
                 memory_format: Any) -> bool:
    if not DIRECT_TO_COPY or dtype is None or dtype == x.dtype or pin_memory or memory_format not in _PLAIN_FORMATS:
        return False
    if layout is not None and layout != torch.strided:
        return False
    if device is not None:
        device = torch.device(device)
        if device.type != "tpu" or (device.index is not None and device.index != x.device.index):
            return False
    return not (dtype in dtypes.FLOAT8 or x.dtype in dtypes.FLOAT8 or dtype.is_complex or x.dtype.is_complex)


@lowers(aten._to_copy.default, kind="eager")
def to_copy(x: torch.Tensor, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
            non_blocking: bool = False, memory_format: Any = None) -> torch.Tensor:
    if _direct_cast(x, dtype, layout, device, pin_memory, memory_format):
        return run_functional(aten._to_copy.default, (x,), {"dtype": dtype})
    return aten._to_copy.default._op_dk(_COMPOSITE, x, dtype=dtype, layout=layout, device=device,
                                        pin_memory=pin_memory, non_blocking=non_blocking,
                                        memory_format=memory_format)


def _moved(array: Any, dst: torch.Tensor) -> Any:
    """`array` on tpu device `dst`'s JAX device (a copy when it lives on another)."""
    return runtime.jax().device_put(array, T.jax_device(dst.device.index))


@lowers(aten._copy_from_and_resize.default, kind="eager")
def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        if dst.device.type == "tpu":
            if src.device.type == "tpu":
                T.replace(dst, _moved(T.value(src), dst) if _MULTI else T.value(src))
            else:
                T.replace(dst, host_copy.from_cpu(src, index=dst.device.index if _MULTI else None))
            return dst
        dst.resize_(src.shape)
    return copy_from(src, dst)


@lowers(aten.resize_.default, kind="eager")
def resize_(t: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    size = [int(s) for s in size]
    if list(t.shape) == size:
        return t
    jnp = runtime.jax().numpy
    old = T.value(t).reshape(-1)
    n = 1
    for s in size:
        n *= s
    flat = jnp.zeros((n,), old.dtype).at[: min(n, old.size)].set(old[: min(n, old.size)])
    T.replace(t, flat.reshape(size))
    return t


class _Freed:
    """The loader of a buffer whose storage was resized to 0 bytes: reading it is an error (CPU and CUDA read
    freed memory; CPU crashes), and it remembers the dtype and shape a later resize_ gives back."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: Any, shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = dtype, shape

    def __call__(self) -> Any:
        raise RuntimeError(
            "hf_tpu: this tpu tensor's storage was resized to 0 bytes (untyped_storage().resize_(0), as "
            "FSDP2 does to free unsharded parameters); resize it back before using the tensor")


class _Zeros:
    """The loader of a buffer grown by a storage resize_: its new elements (zeros, where CPU leaves them
    uninitialised), made on first use, after the kept ones."""

    __slots__ = ("dtype", "shape", "index", "kept")

    def __init__(self, dtype: Any, shape: tuple[int, ...], index: int, kept: Any = None) -> None:
        self.dtype, self.shape, self.index, self.kept = dtype, shape, index, kept

    def __call__(self) -> Any:
        z = float8.zeros(self.shape, self.dtype)
        if _MULTI:  # on the storage's device (zeros are made on JAX's default one)
            z = runtime.jax().device_put(z, T.jax_device(self.index))
        if self.kept is None:
            return z
        flat = z.reshape(-1)
        return flat.at[: self.kept.size].set(self.kept.reshape(-1)).reshape(self.shape)


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """`storage.resize_(nbytes)` for a tpu storage (called by the C++ hooks' resizePrivateUse1Bytes, which
    then records `nbytes` as the storage's size). A tpu storage's numbers are its buffer's JAX array, so
    the array is resized as CPU resizes bytes: its first elements are kept (a grown storage's new ones are
    zeros), 0 bytes drops it. Every tensor over the storage sees the change, as on CPU; growing back to the
    size it had gives the buffer its old shape, so that whole-buffer tensors read it without a slice."""
    buf = _payload_of_storage(storage).buf
    loader = buf._loader
    if buf._array is not None:
        dtype = buf._array.dtype
    elif isinstance(loader, (_Freed, _Zeros)):
        dtype = loader.dtype
    else:  # a lazy `empty` or a pending fused value: its dtype is its array's
        dtype = buf.array.dtype
    itemsize = runtime.jax().numpy.dtype(dtype).itemsize
    if nbytes % itemsize:
        raise RuntimeError(f"hf_tpu: a tpu storage of {dtype} elements ({itemsize} bytes each) cannot be "
                           f"resized to {nbytes} bytes, which is not a whole number of elements")
    n = nbytes // itemsize
    if n == buf.numel and not isinstance(loader, _Freed):
        return
    if n == 0:
        buf.defer(_Freed(dtype, loader.shape if isinstance(loader, _Freed) else buf.shape), (0,))
    elif isinstance(loader, _Freed):
        shape = loader.shape if math.prod(loader.shape) == n else (n,)
        buf.defer(_Zeros(dtype, shape, storage.device.index or 0), shape)
    else:
        old = buf.array.reshape(-1)
        index = storage.device.index or 0
        buf.defer(_Zeros(dtype, (n,), index, old) if n > old.size else functools.partial(_prefix, old, n), (n,))


def _payload_of_storage(storage: torch.UntypedStorage) -> T.Payload:
    """The payload of a tpu tensor's UntypedStorage (tensor.py hangs it there; the C++ hooks hand Python the
    storage)."""
    p = T.storage_payload(storage)
    if p is None:
        raise RuntimeError("hf_tpu: this tpu storage has no data attached: it was not made by a tpu tensor "
                           "(tpu storages exist only behind tpu tensors)")
    return p


def _prefix(flat: Any, n: int) -> Any:
    return flat[:n]


@lowers(aten.set_.source_Tensor, kind="eager")
def set_source_tensor(t: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    t.data = src  # shares src's StorageImpl, hence its payload
    return t


def _off_device_factory(op: Any, args: tuple, kwargs: dict) -> Any:
    """`empty_like(x, device="meta")`, `x.new_zeros(..., device="cpu")` and the like on a tpu `x`: only
    x's shape and dtype matter, so the op runs on a meta stand-in for x and makes its result where asked."""
    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        return x

    margs, mkwargs = map_args(meta, args, kwargs)
    return op(*margs, **mkwargs)


@functools.cache
def is_like_factory(op: Any) -> bool:
    """`*_like` and `new_*` ops, which take a `device` (one that need not be the source's)."""
    name = op.__name__.split(".")[0]
    return (name.endswith("_like") or name.startswith("new_")) and any(
        a.name == "device" for a in op._schema.arguments)


def run_like_factory(op: Any, args: tuple, kwargs: dict) -> Any:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "tpu":
        return _off_device_factory(op, args, kwargs)
    if op is aten.empty_like.default and isinstance(args[0], torch.Tensor):
        # as `empty`: nothing allocated until read (zeros_like and ones_like are empty_like then zero_ or
        # fill_, and `empty_like(x).copy_(y)` replaces the array unread); tpu arrays have no memory format
        return _zeros(args[0].shape, kwargs.get("dtype") or args[0].dtype)
    return run_functional(op, args, kwargs)
