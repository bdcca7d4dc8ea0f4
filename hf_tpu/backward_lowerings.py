"""Backward kernels PyTorch leaves to a PrivateUse1 device, each lowered as jax.vjp of its forward's lowering.

Autograd on `tpu` calls these ATen backward ops (CUDA and CPU have hand-written kernels; PyTorch has no
decomposition for them): `convolution_backward_overrideable` (every conv and transposed conv), the pool,
adaptive-pool, upsample (every mode), grid-sampler, replication/reflection pad, cdist/pdist and
embedding-bag backwards. Rather than hand-writing each gradient, the backward is the VJP of the forward
lowering eager mode already runs (torchax's, ours, or PyTorch's decomposition traced as one program), so
it is exactly the derivative of what the forward computes and becomes one XLA program per call (op_jit).
Hand-written only where the forward's VJP is not PyTorch's gradient: max pooling scatters through the
saved `indices` (the element CPU picked among ties), embedding bag's max mode likewise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import decomposed, half_steps, lowering, op_registry
from hf_tpu.grid_sampler import grid_sampler_float32
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def forward(op: Any) -> Callable[..., Any]:
    """The JAX function eager mode runs `op` with (its lowering, or its decomposition as a traced function)."""
    fn = lowering.find(op)
    if fn is None:
        dec = lowering.decomposition(op)
        if dec is None:
            raise lowering.NoLowering(op, " (needed by a backward)")
        fn = decomposed.as_lowering(op, dec)
    return fn


def _vjp(fn: Callable[..., Any], primals: tuple, grad: Any) -> tuple:
    """Gradients of `fn` at `primals` against the output cotangent `grad` (cast to the output's dtype)."""
    out, pull = _jax().vjp(fn, *primals)
    return pull(grad.astype(out.dtype))


def _first_output(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *a: (lambda r: r[0] if isinstance(r, (tuple, list)) else r)(fn(*a))


def _grad_of_self(fwd_op: Any) -> Callable[..., Any]:
    """`op_backward(grad, self, *rest)` whose forward is `fwd_op(self, *rest)` (pools, pads)."""

    def backward(grad: Any, x: Any, *rest: Any) -> Any:
        fn = _first_output(forward(fwd_op))
        return _vjp(lambda v: fn(v, *rest), (x,), grad)[0]

    return backward


def _adaptive_avg(fwd_op: Any, dims: int) -> Callable[..., Any]:
    def backward(grad: Any, x: Any) -> Any:
        fn = forward(fwd_op)
        return _vjp(lambda v: fn(v, list(grad.shape[-dims:])), (x,), grad)[0]

    return backward


def _upsample(fwd_op: Any) -> Callable[..., Any]:
    """`upsample_*_backward(grad, output_size, input_size, *rest)`: the forward is linear in its input, so
    its VJP at zeros is the gradient."""

    def backward(grad: Any, output_size: Any, input_size: Any, *rest: Any) -> Any:
        fn = forward(fwd_op)
        x = _jax().numpy.zeros(tuple(int(s) for s in input_size), grad.dtype)
        return _vjp(lambda v: fn(v, output_size, *rest), (x,), grad)[0]

    return backward


def _max_pool_with_indices(spatial: int) -> Callable[..., Any]:
    """`max_pool{2,3}d_with_indices_backward`: the output gradient added at the saved flat indices of each
    (batch, channel) plane, as CPU's kernel does (so ties go where the forward's indices say)."""

    def backward(grad: Any, x: Any, *rest: Any) -> Any:
        jnp = _jax().numpy
        indices = rest[-1]
        lead = x.shape[:-spatial]
        plane = 1
        for s in x.shape[-spatial:]:
            plane *= s
        g = grad.reshape(_prod(lead), -1)
        idx = indices.reshape(g.shape).astype(jnp.int32)
        rows = jnp.arange(g.shape[0])[:, None]
        out = jnp.zeros((g.shape[0], plane), jnp.float32).at[rows, idx].add(g.astype(jnp.float32))
        return out.astype(x.dtype).reshape(x.shape)

    return backward


def _prod(xs: Any) -> int:
    n = 1
    for s in xs:
        n *= int(s)
    return n


@lowers(aten.convolution_backward_overrideable.default, kind="backward")
def _convolution_backward(grad: Any, x: Any, weight: Any, stride: Any, padding: Any, dilation: Any,
                          transposed: bool, output_padding: Any, groups: int,
                          output_mask: Any) -> tuple[Any, Any, Any]:
    """(grad_input, grad_weight, grad_bias) of aten.convolution: jax.vjp of its lowering (torchax's
    lax.conv_general_dilated), bias's gradient the output gradient summed over all but the channel dim."""
    conv = forward(aten.convolution.default)
    fn = lambda v, w: conv(v, w, None, stride, padding, dilation, transposed, output_padding, groups)  # noqa: E731
    gx, gw = _vjp(fn, (x, weight), grad)
    gb = grad.sum(axis=tuple(d for d in range(grad.ndim) if d != 1)) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


@lowers(aten.convolution_backward.default, kind="backward")
def _convolution_backward_graph(grad: Any, x: Any, weight: Any, bias_sizes: Any, *rest: Any) -> tuple[Any, Any, Any]:
    """aten.convolution_backward, which AOTAutograd puts in compiled graphs: the overrideable form plus the
    bias's sizes (its gradient's shape is the channel count either way)."""
    return _convolution_backward(grad, x, weight, *rest)


def _grid_sampler(fwd_op: Any) -> Callable[..., Any]:
    def backward(grad: Any, x: Any, grid: Any, mode: int, padding_mode: int, align_corners: bool,
                 output_mask: Any) -> tuple[Any, Any]:
        # the float32 forward (the half lowering rounds every step, which has no useful derivative)
        fn = grid_sampler_float32(fwd_op)
        gx, gg = _vjp(lambda v, g: fn(v, g, mode, padding_mode, align_corners), (x, grid), grad)
        return (gx if output_mask[0] else None, gg if output_mask[1] else None)

    return backward


@lowers(aten._cdist_backward.default, kind="backward")
def _cdist_backward(grad: Any, x1: Any, x2: Any, p: float, cdist: Any) -> Any:
    fn = forward(aten._cdist_forward.default)
    return _vjp(lambda a: fn(a, x2, p, None), (x1,), grad)[0]


@lowers(aten._pdist_backward.default, kind="backward")
def _pdist_backward(grad: Any, x: Any, p: float, pdist: Any) -> Any:
    """Hand-written forward: torchax's _pdist_forward takes norms of the whole distance matrix, whose zero
    diagonal gives NaN gradients; here only the pairs i < j (PyTorch's order) are formed."""
    jnp = _jax().numpy
    i, j = jnp.triu_indices(x.shape[0], k=1)

    def fn(a: Any) -> Any:
        d = jnp.abs(a[i] - a[j])
        if p == float("inf"):
            return d.max(-1)
        if p == 0:
            return (d != 0).sum(-1).astype(a.dtype)
        return (d ** p).sum(-1) ** (1.0 / p)

    return _vjp(fn, (x,), grad)[0]


@lowers(aten._embedding_bag_dense_backward.default, kind="backward")
def _embedding_bag_dense_backward(grad: Any, indices: Any, offset2bag: Any, bag_size: Any, maximum_indices: Any,
                                  num_weights: int, scale_grad_by_freq: bool, mode: int,
                                  per_sample_weights: Any = None, padding_idx: int = -1) -> Any:
    """The weight's gradient: each bag's gradient added to the rows it read (divided by the bag's size for
    mean; for max, only at the saved row of each maximum), scaled by 1/frequency when asked."""
    jnp = _jax().numpy
    n = indices.shape[0]
    out = jnp.zeros((int(num_weights), grad.shape[1]), jnp.float32)
    g = grad.astype(jnp.float32)
    if mode == 2:  # max: maximum_indices[bag, col] is the weight row that won
        cols = jnp.arange(grad.shape[1])[None, :]
        bags_nonempty = (bag_size > 0)[:, None]
        return out.at[maximum_indices.astype(jnp.int32), cols].add(jnp.where(bags_nonempty, g, 0)).astype(grad.dtype)
    bag = offset2bag.astype(jnp.int32) if offset2bag.shape[0] == n else None
    if bag is None:
        raise NotImplementedError("hf_tpu: _embedding_bag_dense_backward without offset2bag")
    rows = g[bag]
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[bag], 1)[:, None].astype(jnp.float32)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(jnp.float32)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
    rows = jnp.where(valid[:, None], rows, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros((int(num_weights),), jnp.float32).at[indices].add(1.0)
        rows = rows / counts[indices][:, None]
    return out.at[indices].add(rows).astype(grad.dtype)


@lowers(aten._embedding_bag_backward.default, kind="backward")
def _embedding_bag_backward(grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any,
                            maximum_indices: Any, num_weights: int, scale_grad_by_freq: bool, mode: int,
                            sparse: bool, per_sample_weights: Any = None, padding_idx: int = -1) -> Any:
    if sparse:
        raise NotImplementedError("hf_tpu: embedding_bag(sparse=True) has no sparse gradients on tpu; "
                                  "use sparse=False")
    if offset2bag.shape[0] != indices.shape[0]:  # sum mode without padding: the forward left it empty
        jnp = _jax().numpy
        offset2bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    return _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                         scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowers(aten._embedding_bag_per_sample_weights_backward.default, kind="backward")
def _embedding_bag_per_sample_weights_backward(grad: Any, weight: Any, indices: Any, offsets: Any,
                                               offset2bag: Any, mode: int, padding_idx: int = -1) -> Any:
    """d(sum_i w_i * weight[idx_i]) / d w_i = <grad[bag_i], weight[idx_i]> (sum mode only, as PyTorch)."""
    jnp = _jax().numpy
    n = indices.shape[0]
    if offset2bag.shape[0] != n:
        offset2bag = jnp.searchsorted(offsets, jnp.arange(n), side="right") - 1
    prod = (grad[offset2bag.astype(jnp.int32)].astype(jnp.float32) * weight[indices].astype(jnp.float32)).sum(-1)
    if padding_idx >= 0:
        prod = jnp.where(indices != padding_idx, prod, 0)
    return prod.astype(grad.dtype)


_avg_pool2d_vjp = _grad_of_self(aten.avg_pool2d.default)


@lowers(aten.avg_pool2d_backward.default, kind="backward")
def _avg_pool2d_backward(grad: Any, x: Any, *rest: Any) -> Any:
    """Half inputs as CPU's kernel accumulates them, in the half type (half_steps); others the VJP."""
    jnp = _jax().numpy
    if grad.dtype in (jnp.float16, jnp.bfloat16):
        return half_steps.avg_pool2d_backward(grad, x, *rest)
    return _avg_pool2d_vjp(grad, x, *rest)


lowers(aten.avg_pool3d_backward.default, kind="backward")(_grad_of_self(aten.avg_pool3d.default))
lowers(aten._adaptive_avg_pool2d_backward.default, kind="backward")(
    _adaptive_avg(aten._adaptive_avg_pool2d.default, 2))
lowers(aten._adaptive_avg_pool3d_backward.default, kind="backward")(
    _adaptive_avg(aten._adaptive_avg_pool3d.default, 3))
lowers(aten.max_pool2d_with_indices_backward.default, kind="backward")(_max_pool_with_indices(2))
lowers(aten.max_pool3d_with_indices_backward.default, kind="backward")(_max_pool_with_indices(3))
lowers(aten.adaptive_max_pool2d_backward.default, kind="backward")(_max_pool_with_indices(2))
lowers(aten.adaptive_max_pool3d_backward.default, kind="backward")(_max_pool_with_indices(3))
lowers(aten.replication_pad1d_backward.default, kind="backward")(
    _grad_of_self(aten.replication_pad1d.default))
lowers(aten.replication_pad2d_backward.default, kind="backward")(
    _grad_of_self(aten.replication_pad2d.default))
lowers(aten.replication_pad3d_backward.default, kind="backward")(
    _grad_of_self(aten.replication_pad3d.default))
lowers(aten.reflection_pad1d_backward.default, kind="backward")(_grad_of_self(aten.reflection_pad1d.default))
lowers(aten.reflection_pad3d_backward.default, kind="backward")(_grad_of_self(aten.reflection_pad3d.default))
lowers(aten.grid_sampler_2d_backward.default, kind="backward")(_grid_sampler(aten.grid_sampler_2d.default))
lowers(aten.grid_sampler_3d_backward.default, kind="backward")(_grid_sampler(aten.grid_sampler_3d.default))
# Elementwise and loss backwards PyTorch has neither a PrivateUse1 kernel nor a decomposition for: the VJP of
# the forward's decomposition (softshrink/hardshrink zero the gradient on [-lambd, lambd], as CPU's kernels).
lowers(aten.softshrink_backward.default, kind="backward")(_grad_of_self(aten.softshrink.default))
lowers(aten.hardshrink_backward.default, kind="backward")(_grad_of_self(aten.hardshrink.default))
lowers(aten.multi_margin_loss_backward.default, kind="backward")(_grad_of_self(aten.multi_margin_loss.default))


for _name in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
              "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
              "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
    lowers(getattr(aten, f"{_name}_backward").default, kind="backward")(_upsample(getattr(aten, _name).default))


_BACKWARD = op_registry.table("backward")


@functools.cache
def find(op: Any) -> Callable[..., Any] | None:
    """The lowering of backward op `op`, or None."""
    return _BACKWARD.get(op)


@lowers(aten.masked_scatter_backward.default, kind="backward")
def _masked_scatter_backward(grad: Any, mask: Any, sizes: Any) -> Any:
    """The source's gradient of `masked_scatter` (every VLM scatters its image features into the text
    embeddings so): the gradient at the masked positions in order, zero-padded to the source's size, as
    PyTorch's `masked_select(grad, mask)` + pad. Written with static shapes (a cumulative count gives each
    masked element its place in the source) because masked_select's size depends on the data, which a
    compiled XLA program cannot have; compiled training of every VLM failed on the missing lowering."""
    jnp = _jax().numpy
    numel = 1
    for s in sizes:
        numel *= int(s)
    m = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    place = jnp.cumsum(m.astype(jnp.int32)) - 1
    # positions not masked (or past the source's end) go to index `numel`, which mode="drop" discards
    idx = jnp.where(m & (place < numel), place, numel)
    out = jnp.zeros((numel,), grad.dtype).at[idx].set(grad.reshape(-1), mode="drop")
    return out.reshape(tuple(int(s) for s in sizes))
