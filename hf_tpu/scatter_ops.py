"""The scatter and accumulating index_put family on integers and bool: torchax's lowerings (registered here
with op_registry.lowers) except where its JAX arithmetic has no integer or bool form.

  put                  CPU's put (repeated indices accumulate, complex kept)
  scatter.value_reduce a scalar source broadcast to index's shape first (torchax indexed it as an array)
  scatter_reduce.two   amin/amax with include_self=False seed the positions with the dtype's extreme (torchax
                       wrote +-inf, which an integer cannot hold: every amin came out INT_MIN)
  bool accumulation    scatter_add, scatter(reduce=add|multiply), scatter_reduce sum/prod, index_put and
                       _unsafe_index_put with accumulate=True: CPU adds bools as a logical or and
                       multiplies them as a logical and, where JAX's add and multiply refuse bool (TpuOpError).
                       They run in int32 (uint8 would wrap at 256 duplicates) and are compared with zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy


def _base(op: Any) -> Callable[..., Any]:
    from hf_tpu.torchax_compat import load_op_table

    lowerings, _ = load_op_table()
    return (lowerings.get(op) or lowerings[op.overloadpacket]).func


def _as_int32(v: Any) -> Any:
    """A bool array or Python bool as int32 (index arrays and other operands unchanged)."""
    jnp = _jnp()
    if isinstance(v, bool):
        return int(v)
    if hasattr(v, "dtype") and v.dtype == jnp.bool_:
        return v.astype(jnp.int32)
    return v


def _logical(base: Callable[..., Any], x: Any, dim: int, index: Any, src: Any, **kwargs: Any) -> Any:
    """`base` (an additive or multiplicative scatter) on a bool `x`: or / and, through int32."""
    return base(_as_int32(x), dim, index, _as_int32(src), **kwargs) != 0


@lowers(aten.scatter_reduce.two)
def _scatter_reduce(x: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True) -> Any:
    jnp = _jnp()
    base = _base(aten.scatter_reduce.two)
    if x.dtype == jnp.bool_ and reduce in ("sum", "prod"):
        return _logical(base, x, dim, index, src, reduce=reduce, include_self=include_self)
    if include_self or reduce not in ("amin", "amax") or jnp.issubdtype(x.dtype, jnp.inexact):
        return base(x, dim, index, src, reduce, include_self=include_self)
    if x.dtype == jnp.bool_:
        extreme = reduce == "amin"
    else:
        info = jnp.iinfo(x.dtype)
        extreme = info.max if reduce == "amin" else info.min
    # a plain scatter of the extreme first
    seeded = base(x, dim, index, jnp.full(index.shape, extreme, x.dtype), None)
    return base(seeded, dim, index, src, reduce, include_self=True)


@lowers(aten.scatter_add.default)
def _scatter_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    base = _base(aten.scatter_add.default)
    return _logical(base, x, dim, index, src) if x.dtype == _jnp().bool_ else base(x, dim, index, src)


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_with_reduce(x: Any, dim: int, index: Any, src: Any, *, reduce: str) -> Any:
    """scatter(..., reduce="add" | "multiply"), src a tensor or a scalar: a scalar is first made an array of
    index's shape (torchax's indexed the 0-d array it made of it: IndexError for every dtype)."""
    jnp = _jnp()
    base = _base(aten.scatter.reduce)
    if not hasattr(src, "shape") or src.ndim == 0:
        src = jnp.full(index.shape, src, x.dtype)
    if x.dtype == _jnp().bool_:
        return _logical(base, x, dim, index, src, reduce=reduce)
    return base(x, dim, index, src, reduce=reduce)


def _index_put_accumulating(op: Any) -> Callable[..., Any]:
    def index_put(x: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
        jnp = _jnp()
        base = _base(op)
        if not (accumulate and x.dtype == jnp.bool_):
            return base(x, indices, values, accumulate)
        return base(x.astype(jnp.int32), indices, jnp.asarray(values).astype(jnp.int32), True) != 0

    return index_put


# index_add's decomposition and `t[idx] += v` accumulate with index_put; _unsafe_masked_index_put_accumulate's
# decomposition with _unsafe_index_put (which differs only in skipping PyTorch's bounds checks)
lowers(aten.index_put.default)(_index_put_accumulating(aten.index_put.default))
lowers(aten._unsafe_index_put.default)(_index_put_accumulating(aten._unsafe_index_put.default))


@lowers(aten.put.default)
def _put(x: Any, index: Any, source: Any, accumulate: bool = False) -> Any:
    """x.put(index, source, accumulate): x read as its flat storage, negative indices counting from the end.
    torchax's accumulated into a float32 buffer (a complex source lost its imaginary part) with jnp.put, which
    keeps one of repeated indices where CPU adds them all; bool accumulates as a logical or."""
    jnp = _jnp()
    flat = x.reshape(-1)
    idx = index.reshape(-1).astype(jnp.int64)
    idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
    src = jnp.asarray(source).reshape(-1)
    if not accumulate:
        return flat.at[idx].set(src.astype(x.dtype)).reshape(x.shape)
    if x.dtype == jnp.bool_:
        return (flat.astype(jnp.int32).at[idx].add(src.astype(jnp.int32)) != 0).reshape(x.shape)
    return flat.at[idx].add(src.astype(x.dtype)).reshape(x.shape)
