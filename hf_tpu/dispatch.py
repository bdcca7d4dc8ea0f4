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

# foreach_ops, optim_lowerings, packed_eager, serialization, storage_ops and view_ops register eager kernels
# (op_registry) when imported
from hf_tpu import (debug_checks, devices, foreach_ops, functionalize, fused, lowering,  # noqa: F401
                    op_registry, optim_lowerings, packed_eager, runtime, serialization, storage_ops, view_ops)
from hf_tpu import tensor as T
from hf_tpu.eager_functional import mixed_device_error, run_functional
from hf_tpu.errors import TpuOpError  # noqa: F401 - re-exported: callers catch dispatch.TpuOpError
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


@lowers(aten._conj.default, kind="eager")
def _conj(src: torch.Tensor) -> torch.Tensor:
    # PyTorch's conjugate view is an alias with the conjugate bit set; its C++ fallback then resolves the bit by
    # copying into an empty_like of the tpu tensor, which recursed until the stack overflowed (and a plain view
    # of ours, without the bit, read unconjugated: Autoformer's FFT autocorrelation in the full-zoo sweep). As
    # for view_as_real, tpu gives a conjugated copy: the values are right, but a write through `x.conj()` does
    # not reach `x` (models only read it). The negative view likewise.
    return dispatch(aten._conj_physical.default, (src,), {})


lowers(aten._neg_view.default, kind="eager")(lambda src: dispatch(aten.neg.default, (src,), {}))
lowers(aten.is_pinned.default, kind="eager")(lambda *a, **k: False)
lowers(aten.record_stream.default, kind="eager")(lambda *a, **k: None)
# Ops eager mode runs by a kernel of ours on tpu tensors, registered where each is written (view_ops.py,
# storage_ops.py, functionalize.py, serialization.py, optim_lowerings.py, here).
_EAGER = op_registry.table("eager")


# op -> how it is run, decided once per op: a dict lookup per call instead of the schema checks
# (OpOverload's hash is a Python function, so every extra dict or cache lookup costs a microsecond).
_routes: dict[Any, Callable[[Any, tuple, dict], Any]] = {}


def _route(op: Any) -> Callable[[Any, tuple, dict], Any]:
    route = _route_of_kind(op)
    check = debug_checks.check_for(op) if debug_checks.enabled() else None
    # TORCH_TPU_ENABLE_DEBUG_CHECKS: bounds checks first (debug_checks.py); nothing added when they are off
    return route if check is None else debug_checks.guarded(check, route)


def _route_of_kind(op: Any) -> Callable[[Any, tuple, dict], Any]:
    special = _EAGER.get(op)
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


debug_checks.on_change(_routes.clear)  # switching the checks rebuilds the routes


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
