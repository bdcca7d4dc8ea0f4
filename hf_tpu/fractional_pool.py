"""aten.fractional_max_pool2d/3d and their backwards: no lowering in torchax or PyTorch's decompositions.

CPU's kernel (ATen/native/FractionalMaxPool2d.cpp, 3d.cpp), given the random samples (N, C, dims) it is
handed: per plane and dimension the window starts are int((i + u) * alpha) - int(u * alpha), alpha =
(in - pool) / (out - 1), computed in the input's dtype (so bfloat16 rounds as CPU's does), the last window
ending at the input's edge; each output is the first maximum of its window in row-major order, and its index
the flat position in the plane. The 2d kernel reads the samples as (w, h), the 3d one as (t, h, w). The
backward adds each output gradient at its index.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _starts(u: Any, size: int, out: int, pool: int) -> Any:
    """Window starts, (..., out) int32, from samples u (...,) in the input's dtype."""
    jnp = _jax().numpy
    dt = u.dtype
    if out == 1:
        return jnp.full(u.shape + (1,), size - pool, jnp.int32)
    alpha = jnp.asarray(size - pool, dt) / jnp.asarray(out - 1, dt)
    i = jnp.arange(out - 1).astype(dt)
    seq = ((i + u[..., None]) * alpha).astype(jnp.int32) - (u * alpha).astype(jnp.int32)[..., None]
    return jnp.concatenate([seq, jnp.full(u.shape + (1,), size - pool, jnp.int32)], axis=-1)


def _pool(nd: int) -> Any:
    order = (1, 0) if nd == 2 else (0, 1, 2)  # which sample column drives each spatial dim

    def fn(x: Any, kernel: Any, output_size: Any, samples: Any) -> tuple[Any, Any]:
        jnp = _jax().numpy
        unbatched = x.ndim == nd + 1
        if unbatched:
            x = x[None]
        spatial = x.shape[2:]
        lead = x.shape[:2]
        flat = x.reshape(lead + (-1,))
        idx = jnp.zeros(lead + (1,) * (2 * nd), jnp.int64)
        stride = 1
        for d in reversed(range(nd)):  # flat index of every (output position, window offset)
            st = _starts(samples[..., order[d]], spatial[d], output_size[d], kernel[d]).astype(jnp.int64)
            pos = st[..., :, None] + jnp.arange(kernel[d])  # (N, C, out_d, k_d)
            shape = list(lead) + [1] * (2 * nd)
            shape[2 + d], shape[2 + nd + d] = output_size[d], kernel[d]
            idx = idx + pos.reshape(shape) * stride
            stride *= spatial[d]
        idx = idx.reshape(lead + tuple(output_size) + (-1,))
        vals = jnp.take_along_axis(flat, idx.reshape(lead + (-1,)), axis=-1).reshape(idx.shape)
        arg = jnp.argmax(vals, axis=-1)  # the first maximum, as CPU's strict >
        out = jnp.take_along_axis(vals, arg[..., None], -1)[..., 0]
        ind = jnp.take_along_axis(idx, arg[..., None], -1)[..., 0]
        return (out[0], ind[0]) if unbatched else (out, ind)

    return fn


def _pool_backward(grad: Any, x: Any, kernel: Any, output_size: Any, indices: Any) -> Any:
    jnp = _jax().numpy
    lead = x.shape[: x.ndim - len(kernel)]
    plane = 1
    for s in x.shape[len(lead):]:
        plane *= s
    g = jnp.zeros(lead + (plane,), grad.dtype)
    flat_i = indices.reshape(lead + (-1,))
    rows = jnp.indices(flat_i.shape)[:-1]
    g = g.at[(*rows, flat_i)].add(grad.reshape(lead + (-1,)))
    return g.reshape(x.shape)


lowers(aten.fractional_max_pool2d.default)(_pool(2))
lowers(aten.fractional_max_pool3d.default)(_pool(3))
lowers(aten.fractional_max_pool2d_backward.default)(_pool_backward)
lowers(aten.fractional_max_pool3d_backward.default)(_pool_backward)
