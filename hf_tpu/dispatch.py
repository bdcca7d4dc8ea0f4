"""Eager mode: the PrivateUse1 fallback that runs every ATen op reaching a `tpu` tensor through JAX.

One Python function serves all ops (PyTorch's pure-Python backend pattern). This module routes each op,
once, by its schema, to the module that runs its kind:
  functional ops           eager_functional.py (the lowering's program, planned for repeats)
  in-place and out= ops    functionalize.py (computed functionally, then written back)
  views                    view_ops.py (aliasing kept in tensor.py, geometry from the meta kernel)
  factories and copies     storage_ops.py
  output dtypes            op_dtypes.py (PyTorch's meta kernels say what each result's dtype is)
Ops are asynchronous, as JAX is; TORCH_TPU_LAUNCH_BLOCKING=1 (or TPU_LAUNCH_BLOCKING=1) waits for each op so
errors surface at the op that caused them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import (devices, functionalize, fused, lowering, optim_lowerings, runtime, serialization, storage_ops,
                    view_ops)
from hf_tpu import tensor as T
from hf_tpu.eager_functional import mixed_device_error, run_functional
from hf_tpu.errors import TpuOpError  # noqa: F401 - re-exported: callers catch dispatch.TpuOpError

aten = torch.ops.aten


def _conj(src: torch.Tensor) -> torch.Tensor:
    # PyTorch's conjugate view is an alias with the conjugate bit set; its C++ fallback then resolves the bit by
    # copying into an empty_like of the tpu tensor, which recursed until the stack overflowed (and a plain view
    # of ours, without the bit, read unconjugated: Autoformer's FFT autocorrelation in the full-zoo sweep). As
    # for view_as_real, tpu gives a conjugated copy: the values are right, but a write through `x.conj()` does
    # not reach `x` (models only read it). The negative view likewise.
    return dispatch(aten._conj_physical.default, (src,), {})


SPECIAL: dict[Any, Callable[..., Any]] = {
    aten.native_batch_norm.default: functionalize.native_batch_norm,
    aten._native_batch_norm_legit.default: functionalize.native_batch_norm,  # the same running-statistics contract
    aten._conj.default: _conj,
    aten._neg_view.default: lambda src: dispatch(aten.neg.default, (src,), {}),
    aten.view_as_real.default: view_ops.view_as_real,
    aten.view_as_complex.default: view_ops.view_as_complex,
    aten.empty.memory_format: storage_ops.empty,
    aten.empty_strided.default: storage_ops.empty_strided,
    aten._copy_from.default: storage_ops.copy_from,
    aten._copy_from_and_resize.default: storage_ops.copy_from_and_resize,
    aten.view.default: view_ops.view,
    aten.view.dtype: view_ops.view_dtype,  # a bitcast copy
    aten._unsafe_view.default: view_ops.view,
    aten._reshape_alias.default: lambda src, size, stride: view_ops.view(src, size),
    aten.alias.default: view_ops.alias,
    aten.as_strided.default: view_ops.as_strided,
    aten.resize_.default: storage_ops.resize_,
    aten.set_.source_Tensor: storage_ops.set_source_tensor,
    aten.set_.source_Storage: serialization.set_source_storage,
    aten.set_.source_Storage_storage_offset: serialization.set_source_storage,
    aten.is_pinned.default: lambda *a, **k: False,
    aten.record_stream.default: lambda *a, **k: None,
    **optim_lowerings.eager_kernels(),  # fused optimizer steps: one program per step, traced hyperparameters
}


# op -> how it is run, decided once per op: a dict lookup per call instead of the schema checks
# (OpOverload's hash is a Python function, so every extra dict or cache lookup costs a microsecond).
_routes: dict[Any, Callable[[Any, tuple, dict], Any]] = {}


def _route(op: Any) -> Callable[[Any, tuple, dict], Any]:
    special = SPECIAL.get(op)
    if special is not None:
        return lambda _op, args, kwargs: special(*args, **kwargs)
    kind = functionalize.kind(op)
    if torch.Tag.inplace_view in op.tags:
        return _inplace_view
    if kind == "functional":
        return storage_ops.run_like_factory if storage_ops.is_like_factory(op) else run_functional
    if kind == "view":
        return view_ops.generic_view
    return functionalize.run_mutating


def dispatch(op: Any, args: tuple, kwargs: dict) -> Any:
    """Runs `op` on its (tpu) arguments. hooks.observe_ops rebinds this name; the re-dispatches here read
    it."""
    fused.current_op = op  # names what made a fused graph run
    try:
        route = _routes[op]
    except KeyError:
        route = _routes[op] = _route(op)
    if _MULTI:
        return _on_device(route, op, args, kwargs)
    return route(op, args, kwargs)


# ------------------------------------------------------------------------------ several devices
_MULTI = devices.MULTI
# Ops whose tensors may be on two devices: the copies between them (the destination's device is the op's).
_COPIES = frozenset({aten._copy_from.default, aten._copy_from_and_resize.default})


def _op_device(op: Any, args: tuple, kwargs: dict) -> int:
    """The tpu device `op` runs on: its tpu tensors' (all on one, else PyTorch's same-device error), else
    the device its `device=` names, else the thread's current device."""
    if op in _COPIES:
        dst = args[1]
        return dst.device.index if dst.device.type == "tpu" else args[0].device.index
    index, first = None, None
    for x in (*args, *kwargs.values()):
        for t in x if isinstance(x, list | tuple) else (x,):  # ATen nests at most one level (Tensor[])
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                if index is None:
                    index, first = t.device.index, t
                elif t.device.index != index:
                    raise mixed_device_error(op, t, first.device)  # type: ignore[union-attr]
    if index is not None:
        return index
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)
        if device.type == "tpu" and device.index is not None:
            return devices.check_index(device.index)
    return devices.current_device()


def _on_device(route: Callable[[Any, tuple, dict], Any], op: Any, args: tuple, kwargs: dict) -> Any:
    """Run `op` on its device: the tensors it makes are that device's, and so are the arrays of programs
    without array inputs (factories), through JAX's default device. Device 0's ops skip the JAX context
    unless they run inside another device's op."""
    index = _op_device(op, args, kwargs)
    before = T.set_op_index(index)
    try:
        if index or before:
            with runtime.jax().default_device(T.jax_device(index)):
                return route(op, args, kwargs)
        return route(op, args, kwargs)
    finally:
        T.set_op_index(before)


def _inplace_view(op: Any, args: tuple, kwargs: dict) -> Any:
    """`transpose_`, `unsqueeze_`, `t_`, `as_strided_`, ...: the tensor itself becomes the view (sizes and
    geometry); its values are not touched."""
    func = functionalize.functional_of(op)
    if func is None:
        raise lowering.NoLowering(op, " (no functional view op to take it from)")
    target = args[0]
    # an overload packet (transpose_ has one overload, transpose several): the dispatcher picks the overload
    view = func(*args, **kwargs) if isinstance(func, torch._ops.OpOverloadPacket) else dispatch(func, args, kwargs)
    target.data = view  # shallow-copies sizes and StorageImpl in C++: the payload (buffer + geometry) follows
    return target


def fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 fallback registered for every ATen op (device.py)."""
    return dispatch(op, args, kwargs)
