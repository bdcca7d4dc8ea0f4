"""In-place (`add_`) and out= (`add.out`) ops on tpu: each is computed by its functional op
(eager_functional.py), then written into its targets, which keep their identity (and their aliases see it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hf_tpu import donated_add, dtypes, float8, fused, lowering
from hf_tpu import tensor as T
from hf_tpu.eager_functional import cpu_fallback, cpu_fallback_enabled, run_functional
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


@functools.cache
def kind(op: Any) -> str:
    """"out", "inplace", "view" or "functional", from the op's schema."""
    schema = op._schema
    if any(a.is_out for a in schema.arguments):
        return "out"
    args = schema.arguments
    if args and args[0].alias_info is not None and args[0].alias_info.is_write:
        return "inplace"
    rets = schema.returns
    if rets and rets[0].alias_info is not None and not rets[0].alias_info.is_write:
        return "view"
    return "functional"


@functools.cache
def functional_of(op: Any) -> Any:
    """The functional op an in-place (`add_`) or out= (`add.out`) op computes."""
    packet = op.overloadpacket
    schema = op._schema
    if kind(op) == "inplace":
        name = packet.__name__.rstrip("_")
        base = getattr(aten, name, None)
        if base is None:
            return None
        ov = schema.overload_name or "default"
        return getattr(base, ov) if ov in base.overloads() else base
    names = [a.name for a in schema.arguments if not a.is_out]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cargs = cand._schema.arguments
        if not any(a.is_out for a in cargs) and [a.name for a in cargs] == names:
            return cand
    # out= overloads often drop kwargs the functional lacks (e.g. dtype): match positionally
    pos = [a.name for a in schema.arguments if not a.is_out and not a.kwarg_only]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cargs = cand._schema.arguments
        if not any(a.is_out for a in cargs) and [a.name for a in cargs if not a.kwarg_only] == pos:
            return cand
    return None


def run_mutating(op: Any, args: tuple, kwargs: dict) -> Any:
    """In-place and out= ops: computed functionally, then written into their targets."""
    func = functional_of(op)
    if func is None:
        if cpu_fallback_enabled():
            return cpu_fallback(op, args, kwargs)
        raise lowering.NoLowering(op, " (no functional form to compute it from)")
    if kind(op) == "inplace":
        target = args[0]
        if op is aten.zero_.default and not fused.ACTIVE and T.zero_lazily(target):
            return target
        if op is aten.add_.Tensor and len(args) == 2 and donated_add.add_(target, args[1], kwargs.get("alpha", 1)):
            return target
        res = run_functional(func, args, kwargs)
        if _writes_several(op):
            return _write_back(op, args, kwargs, res)
        if fused.ACTIVE and isinstance(res, torch.Tensor) and T.adopt_pending(target, res):
            return target
        T.assign(target, T.value(res) if isinstance(res, torch.Tensor) and not res.is_cpu else res)
        return target
    # out=: compute functionally, then store (resizing outputs of the wrong shape, as PyTorch does)
    kwargs = dict(kwargs)
    outs = [kwargs.pop(a.name) for a in op._schema.arguments if a.is_out and a.name in kwargs]
    listed = len(outs) == 1 and isinstance(outs[0], (list, tuple))
    if listed:  # a Tensor[] out (split_with_sizes_copy, unbind_copy, which FSDP2's all-gather copy-out uses)
        outs = list(outs[0])
    fargs = {a.name for a in func._schema.arguments}
    # None kwargs are defaults; torchax lowerings often do not name them (e.g. mean's dtype)
    kwargs = {k: v for k, v in kwargs.items() if k in fargs and v is not None}
    res = run_functional(func, args, kwargs)
    results = list(res) if isinstance(res, (list, tuple)) else [res]
    for o, r in zip(outs, results, strict=False):
        if fused.ACTIVE and isinstance(r, torch.Tensor) and T.adopt_pending(o, r):
            continue
        v = T.value(r) if isinstance(r, torch.Tensor) and r.device.type == "tpu" else r
        if tuple(o.shape) != tuple(getattr(v, "shape", ())) and o.numel() != getattr(v, "size", -1):
            T.replace(o, float8.cast(v, dtypes.to_jax(o.dtype)))
        else:
            T.assign(o, v)
    if listed:
        return None  # these ops return nothing: `-> ()`
    return outs[0] if len(outs) == 1 else tuple(outs)


@functools.cache
def _written_arguments(op: Any) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def _writes_several(op: Any) -> bool:
    """In-place ops that write more than their first argument, or a list of tensors (GradScaler's
    `_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`): their functional form returns every
    written argument, in order."""
    first = op._schema.arguments[0]
    return len(_written_arguments(op)) > 1 or isinstance(first.type, torch.ListType)


def _write_back(op: Any, args: tuple, kwargs: dict, res: Any) -> Any:
    names = [a.name for a in op._schema.arguments]
    results = res if isinstance(res, (list, tuple)) else (res,)
    for name, new in zip(_written_arguments(op), results, strict=False):
        i = names.index(name)
        target = args[i] if i < len(args) else kwargs[name]
        for t, v in zip(target, new, strict=True) if isinstance(target, (list, tuple)) else ((target, new),):
            T.assign(t, T.value(v) if isinstance(v, torch.Tensor) else v)
    first = args[0]
    return None if isinstance(first, (list, tuple)) else first


# _native_batch_norm_legit: the same running-statistics contract
@lowers(aten.native_batch_norm.default, aten._native_batch_norm_legit.default, kind="eager")
def native_batch_norm(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                      momentum: float, eps: float) -> Any:
    """native_batch_norm updates running_mean/var in place in training, though its schema does not mark them
    written, so its functional lowering left a BatchNorm's running statistics at their initial values on
    tpu. Training runs the functional form (PyTorch's decomposition returns the new statistics) and copies
    them into the buffers."""
    args = (x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training or running_mean is None or running_var is None:
        return run_functional(aten.native_batch_norm.default, args, {})
    out, mean, rstd, new_mean, new_var = run_functional(aten._native_batch_norm_legit_functional.default, args, {})
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, rstd


@lowers(aten._batch_norm_with_update.default, kind="eager")
def batch_norm_with_update(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float,
                           eps: float) -> Any:
    """_batch_norm_with_update (nn.functional.batch_norm in training since PyTorch 2.3): the training form of
    native_batch_norm above, with CPU's empty uint8 reserve. Its PyTorch decomposition gave float32 saved
    statistics for half inputs (CPU: the input's dtype) and half outputs off CPU's (batch_norm.py's lowering
    is CPU's arithmetic)."""
    out, mean, rstd = native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, rstd, torch.empty((0,), dtype=torch.uint8, device=x.device)
