"""Eager ops that make or fill storage rather than compute: `empty` (zeros made lazily), copies between tpu
and CPU, `resize_`, `set_`, and `*_like`/`new_*` factories asked for another device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hf_tpu import devices, dtypes, float8, fused, runtime
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
            T.assign(dst, T.from_cpu(src, index=dst.device.index if _MULTI else None))
        return dst
    T.copy_to_cpu(T.value(src), src.dtype, dst)
    return dst


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
                T.replace(dst, T.from_cpu(src, index=dst.device.index if _MULTI else None))
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
    return run_functional(op, args, kwargs)
