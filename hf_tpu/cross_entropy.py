"""Eager `cross_entropy` on tpu as one XLA program forward and one backward, for class-index targets.

`F.cross_entropy` is CompositeImplicitAutograd: above autograd it becomes `log_softmax` then `nll_loss`,
and its backward `nll_loss_backward` then `_log_softmax_backward_data`. In eager mode that is four programs,
and over a language model's logits (GPT-2: 512 x 50,257 float32, 103 MB) each writes or reads a logits-sized
array: the log-probabilities (kept for the backward), a dense gradient holding one nonzero per row, and the
gradient of the logits. Here the forward reads the logits once and keeps two floats per row (the max and
the log of the sum of exponentials); the backward writes the logits' gradient straight from them.

The arithmetic is CPU PyTorch's, step for step, so results differ from CPU's only in summation order and in
the exp/log routines' last bit (the numerics rule's float32 tolerance):
- log_softmax (SoftmaxKernel's lastdim kernel): logp = (x - max) - log(sum(exp(x - max))); the loss takes
  logp at each row's target, as nll_loss does, summed (and divided by the count of rows not ignored, for
  "mean");
- backward: nll_loss_backward puts -s at each row's target (s = grad / count for "mean", grad for "sum",
  the row's grad for "none"; 0 for ignored rows), and _log_softmax_backward_data computes
  g - exp(logp) * sum(g) = exp(logp) * s, minus s at the target.

Taken only where this holds exactly: a plain tpu input of shape (N, C) in float32, int64 targets of shape
(N,), no class weights and no label smoothing (what Transformers' causal-LM loss calls). Everything else
keeps the composite path, as do FakeTensor/FunctionalTensor inputs (torch.compile traces the composite and
XLA fuses the graph itself). Targets outside [0, C) other than ignore_index are not checked (nor are they by
the composite path on tpu); CPU raises.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hf_tpu.op_registry import lowers

OP = torch.ops.aten.cross_entropy_loss.default
_REDUCTIONS = ("none", "mean", "sum")  # torch's Reduction enum: 0, 1, 2


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy


def forward(x: Any, target: Any, *, reduction: int, ignore_index: int) -> tuple[Any, Any, Any]:
    """(loss, row max, row log-sum-exp of x - max) of cross-entropy over the rows of x (N, C)."""
    jnp = _jnp()
    mx = jnp.max(x, axis=1, keepdims=True)
    logsum = jnp.log(jnp.sum(jnp.exp(x - mx), axis=1, keepdims=True))
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    # logp at the target, (x_t - max) - logsum: the same two roundings as taking it from x - max. Taken from x
    # itself, because `x - max` read by both the sum and this gather was written out whole by XLA:CPU (a
    # logits-sized array: GPT-2's loss forward took 145-170 CPU-ms against 80-90 this way, bit-identical)
    at_target = (jnp.take_along_axis(x, safe[:, None], axis=1) - mx) - logsum
    losses = jnp.where(kept, -at_target[:, 0], jnp.zeros((), x.dtype))
    if _REDUCTIONS[reduction] == "none":
        loss = losses
    elif _REDUCTIONS[reduction] == "sum":
        loss = jnp.sum(losses)
    else:
        loss = jnp.sum(losses) / jnp.sum(kept).astype(x.dtype)
    return loss, mx[:, 0], logsum[:, 0]


def backward(grad: Any, x: Any, target: Any, mx: Any, logsum: Any, *, reduction: int,
             ignore_index: int) -> Any:
    """The gradient of forward's loss with respect to x, given the loss's gradient `grad`."""
    jnp = _jnp()
    kept = target != ignore_index
    if _REDUCTIONS[reduction] == "none":
        s = grad
    elif _REDUCTIONS[reduction] == "sum":
        s = jnp.broadcast_to(grad, target.shape)
    else:
        s = jnp.broadcast_to(grad / jnp.sum(kept).astype(x.dtype), target.shape)
    s = jnp.where(kept, s, jnp.zeros((), x.dtype))[:, None]
    p_s = jnp.exp((x - mx[:, None]) - logsum[:, None]) * s
    cls = jnp.arange(x.shape[1], dtype=target.dtype)[None, :]
    return jnp.where(cls == target[:, None], p_s - s, p_s)


def _read(arrays: tuple, keys: tuple, fn: Any, reduction: int, ignore_index: int) -> Any:
    from hf_tpu import tensor as T

    values = [a if k is None else T.apply_operand(a, k) for a, k in zip(arrays, keys, strict=True)]
    return fn(*values, reduction=reduction, ignore_index=ignore_index)


@functools.cache
def _program(fn: Any, reduction: int, ignore_index: int, keys: tuple) -> Any:
    from hf_tpu import xla_options

    # full optimisation at real size, fast compile for small losses (xla_options.py's rule); `keys`: how each
    # argument is read from its buffer (tensor.operand), so that a view (Transformers' logits.view(-1, V))
    # is read inside the program instead of copied out before it (a 103 MB copy at GPT-2 size, each way)
    def run(*arrays: Any) -> Any:
        return _read(arrays, keys, fn, reduction, ignore_index)

    return xla_options.jit(run)


def _call(fn: Any, reduction: int, ignore_index: int, *tensors: torch.Tensor) -> Any:
    from hf_tpu import tensor as T

    arrays, keys = [], []
    for t in tensors:
        o = T.operand(t)
        if type(o) is T.Operand:
            arrays.append(o.array)
            keys.append(o.key)
        else:
            arrays.append(o)
            keys.append(None)
    return _program(fn, reduction, ignore_index, tuple(keys))(*arrays)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, reduction: int,  # type: ignore[override]
                ignore_index: int) -> torch.Tensor:
        from hf_tpu import tensor as T

        loss, mx, logsum = _call(forward, reduction, ignore_index, x, target)
        ctx.reduction, ctx.ignore_index = reduction, ignore_index
        ctx.save_for_backward(x, target, T.wrap(mx), T.wrap(logsum))
        return T.wrap(loss)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        from hf_tpu import tensor as T

        x, target, mx, logsum = ctx.saved_tensors
        g = _call(backward, ctx.reduction, ctx.ignore_index, grad, x, target, mx, logsum)
        return T.wrap(g), None, None, None


def _plain(t: Any) -> bool:
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def eligible(x: Any, target: Any, weight: Any, reduction: int, label_smoothing: float) -> bool:
    """Whether the fused path computes exactly what the composite computes (see the module's docstring)."""
    return (weight is None and label_smoothing == 0.0 and reduction in (0, 1, 2)
            and _plain(x) and _plain(target) and x.device.type == "tpu" and target.device == x.device
            and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0
            and target.dtype == torch.int64 and target.shape == x.shape[:1])


@lowers(OP, kind="autograd")
def kernel(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, reduction: int = 1,
           ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
    """The AutogradPrivateUse1 kernel of aten::cross_entropy_loss."""
    if eligible(x, target, weight, reduction, label_smoothing):
        return _CrossEntropy.apply(x, target, reduction, ignore_index)
    return OP.decompose(x, target, weight, reduction, ignore_index, label_smoothing)
