"""The grid samplers' forward lowerings (grid_sampler_2d, grid_sampler_3d): bfloat16/float16 inputs with bilinear
mode and zeros padding computed step by step in the half type as CPU's kernels do (every c10::Half operation
rounded; float32 throughout put 239 of 780 float16 OpInfo elements off CPU's), everything else PyTorch's
decomposition in float32, rounded once (lowering_parity.opmath), which the backward (backward_lowerings)
differentiates. Above the eager lowering table: the fallback runs a decomposition (issue 26).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from hf_tpu import decomposed, lowering
from hf_tpu.half_kernels import _half_scalar, half_rounded
from hf_tpu.lowering_parity import opmath
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


@functools.cache
def grid_sampler_float32(op: Any) -> Any:
    """PyTorch's decomposition of the grid sampler run in float32 and rounded once (lowering_parity.opmath):
    the lowering for other modes than bilinear with zeros padding, and what the backward differentiates (its
    gradients passed against CPU's as they are)."""
    return opmath(decomposed.as_lowering(op, lowering.decomposition(op)))


def _grid_sample_steps(x: Any, grid: Any, align_corners: bool) -> Any:
    """Bilinear sampling with zeros padding, every step in the half type as CPU's scalar kernels
    (grid_sampler_3d_cpu_impl, _grid_sampler_2d_cpu_fallback; its vectorised 2-D kernel measured
    bit-equal to the same steps): coordinates unnormalised as ((c + 1) * size - 1) / 2, or
    ((c + 1) / 2) * (size - 1) with align_corners; corner weights (ceil - c) or (c - floor) multiplied in
    x, y, z order; the corners, in CPU's order (z, then y, then x, low before high), added one at a time
    where in bounds."""
    jax = _jax()
    jnp = jax.numpy
    half, f32 = x.dtype, jnp.float32

    def r(v: Any) -> Any:
        return half_rounded(v, half)

    def h(n: int) -> float:  # an int64 converted to the half type (c10 operators with an integer)
        return _half_scalar(n, half)

    n, c = x.shape[:2]
    spatial = x.shape[2:]  # (H, W) or (D, H, W)
    k = len(spatial)
    g = grid.astype(f32)
    coords, floors = [], []
    for axis in range(k):  # grid's last dim is (x, y[, z]) for sizes (W, H[, D])
        size = spatial[k - 1 - axis]
        v = g[..., axis]
        if align_corners:
            v = r(r(r(v + 1) / 2) * h(size - 1))
        else:
            v = r(r(r(r(v + 1) * h(size)) - 1) / 2)
        coords.append(v)
        floors.append(jnp.floor(v))
    flat = x.reshape(n, c, -1)
    out = jnp.zeros((n, c, *g.shape[1:-1]), f32)
    for corner in np.ndindex(*([2] * k)):  # (dz, dy, dx) or (dy, dx): z slowest, as CPU lists them
        offs = corner[::-1]  # per axis x, y[, z]
        weight, ok, index = None, jnp.ones(g.shape[:-1], bool), 0
        for axis in range(k):
            lo, v = floors[axis], coords[axis]
            f = r(v - lo) if offs[axis] else r(r(lo + 1) - v)
            weight = f if weight is None else r(weight * f)
            pos = lo + offs[axis]
            size = spatial[k - 1 - axis]
            ok = ok & (pos >= 0) & (pos < size)
        for axis in reversed(range(k)):  # row-major index over (z, y, x)
            size = spatial[k - 1 - axis]
            pos = jnp.clip(floors[axis] + offs[axis], 0, size - 1).astype(jnp.int32)
            index = index * size + pos
        vals = jnp.take_along_axis(flat, index.reshape(n, 1, -1), axis=2).reshape(out.shape).astype(f32)
        term = r(vals * weight[:, None])
        out = jnp.where(ok[:, None], r(out + term), out)
    return out.astype(half)


def _grid_sampler(op: Any) -> Any:
    def lowering(x: Any, grid: Any, mode: int, padding_mode: int, align_corners: bool) -> Any:
        jnp = _jax().numpy
        if mode == 0 and padding_mode == 0 and x.dtype in (jnp.bfloat16, jnp.float16) and grid.dtype == x.dtype:
            return _grid_sample_steps(x, grid, bool(align_corners))
        return grid_sampler_float32(op)(x, grid, mode, padding_mode, align_corners)

    lowering.__doc__ = f"{op}: half inputs with bilinear mode and zeros padding as _grid_sample_steps"
    return lowering


lowers(aten.grid_sampler_2d.default)(_grid_sampler(aten.grid_sampler_2d.default))
lowers(aten.grid_sampler_3d.default)(_grid_sampler(aten.grid_sampler_3d.default))
