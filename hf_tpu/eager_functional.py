"""Eager mode's functional ops: an op's lowering (or its decomposition traced as one program) run on the
arrays behind its tpu arguments, planned for repeats (plans.py), with the CPU fallback when asked for.

In-place and out= ops (functionalize.py), factories (storage_ops.py) and views (view_ops.py) end here too.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import (backward_lowerings, decomposed, devices, dtypes, float8, fused, lowering, op_jit, op_registry,
                    plans, precision, program_bound, runtime)
from hf_tpu import host_copy
from hf_tpu import tensor as T
from hf_tpu.errors import TpuOpError
from hf_tpu.op_dtypes import integral_promotion, leaves, map_args, meta_dtypes, wrap_outputs

aten = torch.ops.aten
_fallback_counts: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()


def cpu_fallback_enabled() -> bool:
    return os.environ.get("HF_TPU_CPU_FALLBACK", "0") == "1"


def fallback_ops() -> dict[str, int]:
    """Ops that ran on the CPU fallback since the last reset, with how often."""
    with _lock:
        return dict(_fallback_counts)


def reset_fallback_ops() -> None:
    with _lock:
        _fallback_counts.clear()


def cpu_fallback(op: Any, args: tuple, kwargs: dict) -> Any:
    """`op` run by PyTorch's CPU kernel on copies of its tpu arguments; the results moved to tpu."""
    def to_cpu(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return host_copy.to_cpu(T.value(x), x.dtype)
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        return x

    cargs, ckwargs = map_args(to_cpu, args, kwargs)
    res = op(*cargs, **ckwargs)
    with _lock:
        _fallback_counts[lowering.op_name(op)] += 1
    return pytree.tree_map_only(torch.Tensor, lambda t: T.wrap(host_copy.from_cpu(t), t.dtype), res)


# ---------------------------------------------------------------------------------------------- devices
def check_device(device: Any) -> None:
    if device is None:
        return
    device = torch.device(device)
    if device.type == "tpu":
        devices.check_index(device.index)


def mixed_device_error(op: Any, other: torch.Tensor, device: Any = None) -> RuntimeError:
    """PyTorch's error for an op given tensors of two devices: `other`'s and `device` (the op's)."""
    here = f"tpu:{T.op_index()}" if device is None else str(device)
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {here} and "
        f"{other.device}! (when checking arguments for {lowering.op_name(op)})"
    )


# Ops that accept CPU index tensors next to device tensors, as CUDA does. `_index_put_impl` (functional) too:
# the backward of x[cpu_index] on tpu reaches it, and DeepSeek-OCR2 / DeepSeek-VL-hybrid's train step raised there.
_CPU_INDEX_OK = {"index", "index_put", "index_put_", "_index_put_impl_", "_index_put_impl", "_unsafe_index",
                 "_unsafe_index_put"}


def _unwrap(op: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type == "tpu":
            return T.operand(x)  # a view stays geometry: the op's program reads it (op_jit)
        if x.dim() == 0 or op.__name__.split(".")[0] in _CPU_INDEX_OK:
            return host_copy.from_cpu(x)  # a CPU scalar tensor acts as a scalar, as on CUDA
        raise mixed_device_error(op, x)
    if isinstance(x, torch.device):
        check_device(x)
    return x


# ------------------------------------------------------------------------------------------ lowerings
# float8 operands these ops take as they are: conversions (which give CPU's bits themselves), bit views, and
# _scaled_mm (float8.py, which checks its operands are float8).
_FLOAT8_AS_IS = op_registry.mark("float8_as_is", {aten._to_copy.default, aten.view.dtype, aten.clone.default,
                                                 aten.alias.default, aten.lift_fresh.default,
                                                 aten._scaled_mm.default})


def eager_lowering(op: Any) -> Callable[..., Any] | None:
    """The JAX function eager mode runs `op` with: its lowering, or else its decomposition traced as one
    program (decomposed.py). Compiled mode decomposes in the graph instead (compile.py). Looked up on each
    call of the general path, so a lowering replaced at run time (hooks.override_lowerings: the canary's
    fault) is honoured."""
    fn = backward_lowerings.find(op) or lowering.find(op)
    # keyed by `lowering.find` too: a traced decomposition has its sub-ops' lowerings baked in, so a replaced
    # lowering (the canary's fault in bmm) must give SDPA's decomposition a new program
    return fn if fn is not None else _decomposed(op, lowering.find)


def _own_lowerings() -> bool:
    """The lowering table is the package's own: no hooks.override_lowerings in force (it replaces
    lowering.find). Then an op's lowering is named by the op itself, in every process (op_jit's `shared`)."""
    return getattr(getattr(lowering.find, "__wrapped__", None), "__module__", None) == lowering.__name__


@functools.cache
def _decomposed(op: Any, find: Callable[[Any], Any]) -> Callable[..., Any] | None:
    if not decomposed.traceable(op):
        return None
    dec = lowering.decomposition(op)
    if dec is None and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        dec = op.decompose  # a composite sent to us whole (sdpa.py): PyTorch's own decomposition
    return None if dec is None else decomposed.as_lowering(op, dec)


# ----------------------------------------------------------------------------------------------- run
def run_functional(op: Any, args: tuple, kwargs: dict) -> Any:
    """`op` on tpu tensors: a plan made by an earlier call with the same signature, or the general path."""
    if program_bound.due:  # enough executables compiled since the last look: bound the live ones (a safe point)
        program_bound.check(runtime.jax())
    key, arrays = plans.signature(op, args, kwargs)
    if key is not None:
        # not checked against eager_lowering(op): a lowering changes at run time only through
        # hooks.override_lowerings, which forgets every plan
        plan = plans.table.get(key)
        if plan is not None:
            if fused.ACTIVE:
                try:
                    return plans.defer(plan, arrays, op)
                except Exception:  # shapes the program cannot take: the general path raises properly
                    pass
            try:
                return plans.run(plan, arrays, fused.LAUNCH_BLOCKING)
            except Exception:  # e.g. shapes the program cannot take: the general path raises properly
                pass
    res, plan = _run_functional(op, args, kwargs)
    if key is not None and plan is not None:
        plans.table[key] = plan
    return res


def _run_functional(op: Any, args: tuple, kwargs: dict) -> tuple[Any, plans.Plan | None]:
    """The general path: the result, and a Plan for repeating it when it is one array, or a flat tuple of
    arrays, from one program."""
    fn = eager_lowering(op)
    if fn is None:
        dec = lowering.decomposition(op)  # a factory's, run as it is (decomposed.traceable)
        if dec is not None:
            return dec(*args, **kwargs), None
        if cpu_fallback_enabled():
            return cpu_fallback(op, args, kwargs), None
        raise lowering.NoLowering(op)
    jargs, jkwargs = map_args(functools.partial(_unwrap, op), args, kwargs)
    promote_to = integral_promotion(op, args, kwargs)
    plannable = True
    if promote_to is not None:
        # views are read here, so the program takes their values; a plan (keyed by view geometry, fed the
        # buffers) would hand it the buffers instead
        plannable = not any(type(x) is T.Operand for x in leaves(jargs, jkwargs))
        jargs, jkwargs = op_jit.materialise(jargs, jkwargs)
        jargs, jkwargs = map_args(lambda x: x.astype(promote_to) if plans.is_array(x) else x, jargs, jkwargs)
    narrow_to = None
    if promote_to is None and op not in _FLOAT8_AS_IS:
        narrow_to = next((x.dtype for x in leaves(args, kwargs)
                          if isinstance(x, torch.Tensor) and x.dtype in float8.DTYPES), None)
    if narrow_to is not None:
        # CPU computes float8 ops in float32 and rounds once (float8.py); the outputs are cast back to PyTorch's
        # dtypes by wrap_outputs. Not planned: a plan would hand the program the float8 buffers.
        plannable = False
        jargs, jkwargs = op_jit.materialise(jargs, jkwargs)
        jargs, jkwargs = map_args(float8.widen, jargs, jkwargs)
    try:
        res, program = op_jit.call_with_program(op, fn, jargs, jkwargs, precision.current(),
                                                not lowering.is_random(op), _own_lowerings())
        if narrow_to is not None and meta_dtypes(op, args, kwargs) is None:  # data-dependent shapes
            want = dtypes.to_jax(narrow_to)
            res = pytree.tree_map(lambda r: float8.cast(r, want) if plans.is_array(r) and r.dtype.name == "float32"
                                  else r, res)
    except (NotImplementedError, lowering.NoLowering):
        raise
    except Exception as exc:
        if cpu_fallback_enabled():
            return cpu_fallback(op, args, kwargs), None
        raise TpuOpError(op, exc) from exc
    if res is NotImplemented:  # torchax declines some argument combinations
        if cpu_fallback_enabled():
            return cpu_fallback(op, args, kwargs), None
        raise lowering.NoLowering(op, " for these arguments")
    out = wrap_outputs(op, res, args, kwargs)
    plan = plans.make(program, promote_to, res, out) if program is not None and plannable else None
    return out, plan
