"""Eager mode's dtype bookkeeping: the output dtypes PyTorch gives an op (its meta kernel, cached), the
promotion of integer inputs an op makes floating, and results cast to PyTorch's dtypes as they are wrapped.

torchax's lowerings sometimes return a different dtype than PyTorch (JAX promotion, x64 defaults); the
results are cast so that `.dtype` and the numbers agree with CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import dtypes, float8, fused, op_registry, plans
from hf_tpu import tensor as T

aten = torch.ops.aten
_meta_cache: dict[Any, Any] = {}


def leaves(args: tuple, kwargs: dict) -> list[Any]:
    """An op's arguments, flat. ATen arguments nest at most one level (Tensor[]): cheaper than a general
    pytree walk per op."""
    out: list[Any] = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, list | tuple):
            out.extend(x)
        else:
            out.append(x)
    return out


def map_args(f: Callable[[Any], Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`f` applied to each argument (and to each element of a list argument)."""
    def one(x: Any) -> Any:
        if isinstance(x, list | tuple):
            return type(x)(f(v) for v in x)
        return f(x)

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def meta_dtypes(op: Any, args: tuple, kwargs: dict) -> list[torch.dtype] | None:
    """The output dtypes PyTorch gives this op for these input dtypes (meta kernels, cached)."""
    key = (op, torch.get_default_dtype(),  # factories without a dtype (and float scalars) follow the default
           tuple((x.dtype, x.dim() == 0, x.device.type) if isinstance(x, torch.Tensor) else
                 (x if isinstance(x, (torch.dtype, bool)) else type(x)) for x in leaves(args, kwargs)),
           tuple(kwargs))  # the names too: searchsorted(right=True) and (out_int32=True) differ in dtype
    try:
        return _meta_cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable leaf
        return None

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("meta")
        return x

    try:
        margs, mkwargs = map_args(to_meta, args, kwargs)
        out = op(*margs, **mkwargs)
        result = [o.dtype if isinstance(o, torch.Tensor) else None for o in pytree.tree_leaves(out)]
    except Exception:
        result = None
    _meta_cache[key] = result
    return result


def integral_promotion(op: Any, args: tuple, kwargs: dict) -> Any:
    """The JAX dtype to promote all inputs to first, or None. Integer or bool inputs of an op whose result
    PyTorch makes floating (sigmoid, rsqrt, true division) are promoted, as PyTorch does; JAX's float
    functions reject integer arrays."""
    tensors = [x for x in leaves(args, kwargs) if isinstance(x, torch.Tensor)]
    if not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors):
        return None
    expected = meta_dtypes(op, args, kwargs)
    if not expected or expected[0] is None or not expected[0].is_floating_point:
        return None
    return dtypes.to_jax(expected[0])


def _wrap_one(x: Any, dt: torch.dtype | None) -> torch.Tensor:
    if dt is not None:
        want = dtypes.to_jax(dt)
        if want != x.dtype:
            x = float8.cast(x, want)
    if fused.LAUNCH_BLOCKING:  # a module global read per op (an environment lookup showed in profiles)
        plans.block(x)
    return T.wrap(x, dt)


# Ops whose lowerings give CPU's output dtypes where PyTorch's meta kernels do not: batch norm's saved
# statistics are float32 by the meta kernel, but CPU keeps them in the parameters' dtype (bfloat16 input
# and parameters give bfloat16 statistics); so are layer norm's (half_kernels._native_layer_norm).
_LOWERING_DTYPES = op_registry.mark("lowering_dtypes", {
    aten.native_batch_norm.default, aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default, aten.native_layer_norm.default})


def wrap_outputs(op: Any, res: Any, args: tuple, kwargs: dict) -> Any:
    """A lowering's result (arrays, or a tree of them) as tpu tensors of the dtypes PyTorch gives `op`."""
    if op in _LOWERING_DTYPES:
        return pytree.tree_map(lambda x: _wrap_one(x, None) if plans.is_array(x) else x, res)
    if plans.is_array(res):  # the common case: one array
        expected = meta_dtypes(op, args, kwargs)
        return _wrap_one(res, expected[0] if expected else None)
    flat, spec = pytree.tree_flatten(res)
    if not any(plans.is_array(x) for x in flat):
        return res  # a Python scalar or bool (.item(), is_nonzero, ...)
    expected = meta_dtypes(op, args, kwargs)
    out = [
        _wrap_one(x, expected[i] if expected and i < len(expected) else None) if plans.is_array(x) else x
        for i, x in enumerate(flat)
    ]
    return pytree.tree_unflatten(out, spec)
