"""multilabel_margin_loss forward and backward, as CPU's kernels (ATen/native/LossMultiLabelMargin.cpp).

Hand-written because PyTorch's decomposition of `multilabel_margin_loss_forward` is wrong for a row whose
target list ends (a -1) before its last column: it masks the listed targets out of the columns but not the
unlisted slots out of the target axis, so each slot past the end counts column 0 as a target again (measured:
5.41 where CPU gives 1.91); the OpInfo samples never end a list early. PyTorch has no backward decomposition.

For each row, each listed target t (the entries before the first -1; duplicates count again) and each column
d that is not a listed target: z = 1 - x[t] + x[d]; the loss is sum(max(z, 0)) / dim, and where z > 0 the
gradient adds g to column d and takes g from column t (g = grad / dim, and / rows for the mean).
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _terms(x: Any, target: Any) -> tuple[Any, ...]:
    """(x as float32 [rows, dim], valid [rows, k], target index [rows, k], listed [rows, dim], z [rows, k, dim],
    active [rows, k, dim]) of a 1-D or 2-D input."""
    jnp = _jax().numpy
    xv = x.reshape(1, -1) if x.ndim <= 1 else x
    tv = target.reshape(xv.shape)
    dim = xv.shape[1]
    col = jnp.arange(dim)
    end = jnp.min(jnp.where(tv == -1, col, dim), axis=-1, keepdims=True)
    valid = col < end  # the k-th slot holds a listed target
    tidx = jnp.where(valid, tv, 0).astype(jnp.int32)
    xf = xv.astype(jnp.float32)
    listed = jnp.any(valid[:, :, None] & (tidx[:, :, None] == col[None, None, :]), axis=1)
    xt = jnp.take_along_axis(xf, tidx, axis=1)
    z = 1.0 - xt[:, :, None] + xf[:, None, :]
    active = valid[:, :, None] & ~listed[:, None, :] & (z > 0)
    return xf, valid, tidx, listed, z, active


@lowers(aten.multilabel_margin_loss_forward.default)
def _forward(x: Any, target: Any, reduction: int) -> tuple[Any, Any]:
    jnp = _jax().numpy
    xf, _, _, listed, z, active = _terms(x, target)
    per_row = jnp.where(active, z, 0).sum(axis=(1, 2)) / xf.shape[1]
    if reduction == 1:
        loss = per_row.mean()
    elif reduction == 2:
        loss = per_row.sum()
    else:
        loss = per_row if x.ndim > 1 else per_row.reshape(())
    return loss.astype(x.dtype), listed.astype(x.dtype).reshape(target.shape)


@lowers(aten.multilabel_margin_loss_backward.default, kind="backward")
def _backward(grad: Any, x: Any, target: Any, reduction: int, is_target: Any) -> Any:
    jnp = _jax().numpy
    xf, valid, tidx, _, _, active = _terms(x, target)
    rows, dim = xf.shape
    g = grad.astype(jnp.float32)
    g = g.reshape(rows, 1) if reduction == 0 else jnp.broadcast_to(g / rows if reduction == 1 else g, (rows, 1))
    g = g / dim
    a = active.astype(jnp.float32)
    out = a.sum(axis=1) * g  # column d gains g per active (t, d)
    lose = jnp.where(valid, a.sum(axis=2) * g, 0)  # slot k's target loses g per active d
    out = out.at[jnp.arange(rows)[:, None], tidx].add(-lose)
    return out.astype(x.dtype).reshape(x.shape)
