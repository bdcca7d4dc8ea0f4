"""aten.segment_reduce and its backward (torch.segment_reduce): no lowering in torchax or PyTorch's decompositions.

Segments are given by lengths or offsets along `axis` (shaped data.shape[:axis] + (segments,)); each element
goes to the segment whose [offsets[s], offsets[s+1]) holds it, folded in order into an accumulator of the
data's dtype as CPU's kernel does (one lax.scan over the axis). As CPU: `initial` starts every segment's reduction (an empty segment gives it, or the
reduction's identity: 0, -inf, inf, 1, and NaN for a mean). The backward is the vector-Jacobian product of
the same function, so gradients follow JAX's rules (ties of max/min share the gradient, as CPU's kernel does).
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _forward(data: Any, reduce: str, lengths: Any, offsets: Any, axis: int, initial: Any) -> Any:
    """CPU's kernel: per segment, an accumulator in the data's dtype starting at `initial` (or the identity),
    folding the segment's elements in order, so half types round after every step as CPU's do."""
    jax = _jax()
    jnp = jax.numpy
    if reduce not in ("sum", "mean", "prod", "max", "min"):
        raise RuntimeError(f"segment_reduce: unsupported reduction {reduce}")
    if offsets is None:
        if lengths is None:
            raise NotImplementedError("segment_reduce on tpu takes lengths or offsets")
        zero = jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype)
        offsets = jnp.concatenate([zero, jnp.cumsum(lengths, axis=-1)], axis=-1)
    axis = axis % data.ndim  # offsets: data.shape[:axis] + (segments + 1,)
    n_seg, trail = offsets.shape[-1] - 1, data.ndim - axis - 1
    starts, ends = offsets[..., :-1], offsets[..., 1:]
    identity = {"sum": 0, "mean": 0, "prod": 1, "max": -jnp.inf, "min": jnp.inf}[reduce]
    acc0 = jnp.full(data.shape[:axis] + (n_seg,) + data.shape[axis + 1:],
                    identity if initial is None else initial, data.dtype)
    fold = {"sum": jnp.add, "mean": jnp.add, "prod": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum}[reduce]

    def step(acc: Any, xi: Any) -> tuple[Any, None]:
        x, i = xi
        member = ((starts <= i) & (i < ends)).reshape(starts.shape + (1,) * trail)
        return jnp.where(member, fold(acc, jnp.expand_dims(x, axis)), acc), None

    xs = (jnp.moveaxis(data, axis, 0), jnp.arange(data.shape[axis]))
    out, _ = jax.lax.scan(step, acc0, xs)
    if reduce == "mean":
        count = (ends - starts).reshape(starts.shape + (1,) * trail)
        empty = jnp.asarray(jnp.nan if initial is None else initial, data.dtype)
        out = jnp.where(count > 0, out / jnp.where(count > 0, count, 1).astype(data.dtype), empty)
    return out


@lowers(aten.segment_reduce.default)
def _segment_reduce(data: Any, reduce: str, *, lengths: Any = None, indices: Any = None, offsets: Any = None,
                    axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:
    return _forward(data, reduce, lengths, offsets, axis, initial)


@lowers(aten._segment_reduce_backward.default)
def _segment_reduce_backward(grad: Any, output: Any, data: Any, reduce: str, *, lengths: Any = None,
                             offsets: Any = None, axis: int = 0, initial: Any = None) -> Any:
    _, vjp = _jax().vjp(lambda d: _forward(d, reduce, lengths, offsets, axis, initial), data)
    return vjp(grad.astype(data.dtype))[0]
