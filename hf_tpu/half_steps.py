"""Lowerings of ops whose CPU kernels compute bfloat16/float16 inputs step by step in the half type itself
(c10::Half / c10::BFloat16 scalar arithmetic: every operation rounded), where lowering_parity's float32
evaluation rounds once and so differs from CPU (found by tests/hf_tpu/op_parity.py, issue 26):

  _adaptive_avg_pool3d -> adaptive_avg_pool3d_out_frame: each window summed in the half type in (t, h, w)
                          order, then divided by kT, kH and kW in turn, each quotient rounded
  soft_margin_loss     -> neg_out(input).mul_(target).exp_().log1p_() on half tensors, then the reduction,
                          and its backward: -norm * target * z / (1 + z) * grad_output, each step rounded
  _trilinear           -> bilinear's kernel: two contractions (GEMMs), each rounded, slices added in turn
  avg_pool2d_backward  -> cpu_avg_pool2d_backward: grad / divisor rounded, added to each window's inputs in turn
                          (called by backward_lowerings for half gradients)

Other dtypes keep torchax's lowering or PyTorch's decomposition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_tpu.half_kernels import _vector_block, half_rounded
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _windows(out_size: int, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Adaptive pooling's windows along one dim: (out_size, k_max) input positions (0 where padded) and the
    (out_size,) window lengths; start floor(o * in / out), end ceil((o + 1) * in / out), as CPU's kernel."""
    o = np.arange(out_size)
    start = (o * in_size) // out_size
    end = -(-((o + 1) * in_size) // out_size)
    length = end - start
    k = int(length.max()) if out_size else 0
    pos = start[:, None] + np.arange(k)[None, :]
    return np.where(np.arange(k)[None, :] < length[:, None], pos, 0), length


def _base(op: Any) -> Any:
    from hf_tpu.torchax_compat import load_op_table

    table = load_op_table()[0]
    return (table.get(op) or table[op.overloadpacket]).func


@lowers(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(x: Any, output_size: Any) -> Any:
    """CPU's adaptive_avg_pool3d for half inputs (adaptive_avg_pool3d_out_frame, `scalar_t sum` += each element,
    then `sum / kT / kH / kW`): the window's elements added one at a time in (t, h, w) order, each sum rounded
    to the half type (a padded element adds an exact 0), then three divisions, each rounded; bit-equal to CPU
    where float32 accumulation put 199 of 1,120 float16 elements outside tolerance. Padded (absent) window
    positions are gathered as position 0 and zeroed."""
    jax = _jax()
    jnp = jax.numpy
    if x.dtype not in (jnp.bfloat16, jnp.float16) or x.size == 0:
        return _base(aten._adaptive_avg_pool3d.default)(x, output_size)
    half, f32 = x.dtype, jnp.float32
    sizes = [int(s) for s in output_size]
    dims = [_windows(o, i) for o, i in zip(sizes, x.shape[-3:])]
    (tp, tl), (hp, hl), (wp, wl) = dims
    kt, kh, kw = tp.shape[1], hp.shape[1], wp.shape[1]
    # (..., oT, kT, oH, kH, oW, kW) by gathering each spatial dim in turn
    g = jnp.take(x.astype(f32), jnp.asarray(tp.reshape(-1)), axis=-3).reshape(*x.shape[:-3], sizes[0], kt, *x.shape[-2:])
    g = jnp.take(g, jnp.asarray(hp.reshape(-1)), axis=-2).reshape(*g.shape[:-2], sizes[1], kh, x.shape[-1])
    g = jnp.take(g, jnp.asarray(wp.reshape(-1)), axis=-1).reshape(*g.shape[:-1], sizes[2], kw)
    valid = ((np.arange(kt)[None, :] < tl[:, None])[:, :, None, None, None, None]
             & (np.arange(kh)[None, :] < hl[:, None])[None, None, :, :, None, None]
             & (np.arange(kw)[None, :] < wl[:, None])[None, None, None, None, :, :])
    g = jnp.where(jnp.asarray(valid), g, 0.0)
    lead = g.ndim - 6
    # window elements first, in CPU's (t, h, w) order; outputs (oT, oH, oW) after
    g = jnp.transpose(g, (lead + 1, lead + 3, lead + 5, *range(lead), lead, lead + 2, lead + 4))
    g = g.reshape(kt * kh * kw, *g.shape[3:])

    def add(total: Any, v: Any) -> tuple[Any, None]:
        return half_rounded(total + v, half), None

    total = jax.lax.scan(add, jnp.zeros(g.shape[1:], f32), g)[0]
    for length, shape in ((tl, (-1, 1, 1)), (hl, (1, -1, 1)), (wl, (1, 1, -1))):
        # a float32 quotient of two half values, rounded to the half type (c10::Half's operator/); divided in
        # float64 so that XLA cannot turn it into a multiplication by the reciprocal
        q = total.astype(jnp.float64) / jnp.asarray(length.reshape(shape), jnp.float64)
        total = half_rounded(q.astype(f32), half)
    return total.astype(half)


@lowers(aten.soft_margin_loss.default)
def _soft_margin_loss(x: Any, target: Any, reduction: int = 1) -> Any:
    """CPU's soft_margin_loss: `neg_out(output, input).mul_(target).exp_().log1p_()`, each in-place step on a
    tensor of the result's dtype, so for half inputs every step rounded (exp overflows to inf in float16 as on
    CPU; PyTorch's decomposition computes in float32 and gave 7.64 where CPU gives inf), then the mean or sum
    as CPU's reductions (float32 accumulation, rounded once)."""
    jnp = _jax().numpy
    dtype = jnp.result_type(x, target)
    half = dtype in (jnp.bfloat16, jnp.float16)
    acc = jnp.float32 if half else dtype
    if half:
        prod = half_rounded(-x.astype(acc) * target.astype(acc), dtype)
        loss = half_rounded(jnp.log1p(half_rounded(jnp.exp(prod), dtype)), dtype)
    else:
        loss = jnp.log1p(jnp.exp(-x.astype(dtype) * target.astype(dtype)))
    if reduction == 0:
        return loss.astype(dtype)
    total = jnp.sum(loss.astype(acc))
    if reduction == 1:  # CPU's mean: the sum divided by the count, correctly rounded in the accumulation type
        total = (total.astype(jnp.float64) / loss.size).astype(acc) if loss.size else jnp.asarray(jnp.nan, acc)
    return total.astype(dtype)


@lowers(aten.soft_margin_loss_backward.default)
def _soft_margin_loss_backward(grad: Any, x: Any, target: Any, reduction: int) -> Any:
    """CPU's soft_margin_loss_backward: z = exp(-target * input), then -norm * target * z / (1 + z) *
    grad_output left to right (norm = 1 / numel for the mean, a double the half kernels take as float32),
    each step rounded for half types (measured bit-equal on 300 elements per reduction; an infinite z gives
    NaN as on CPU, where the forward's loss is inf)."""
    jnp = _jax().numpy
    dtype = jnp.result_type(grad, x, target)
    norm = 1.0 / x.size if reduction == 1 and x.size else 1.0
    if dtype not in (jnp.bfloat16, jnp.float16):
        z = jnp.exp(-target.astype(dtype) * x.astype(dtype))
        return (-norm * target * z / (1 + z) * grad).astype(dtype)
    f32 = jnp.float32

    def r(v: Any) -> Any:
        return half_rounded(v, dtype)

    t, xf, g = target.astype(f32), x.astype(f32), grad.astype(f32)
    z = r(jnp.exp(r(-t * xf)))
    out = r(r(np.float32(-norm) * t) * z)
    out = r(out / r(z + 1))
    return jnp.broadcast_to(r(out * g), jnp.broadcast_shapes(x.shape, target.shape, grad.shape)).astype(dtype)


@lowers(aten._trilinear.default)
def _trilinear(i1: Any, i2: Any, i3: Any, expand1: Any, expand2: Any, expand3: Any, sumdim: Any,
               unroll_dim: int = 1) -> Any:
    """CPU's _trilinear (bilinear's kernel, and its own gradients'): i1 * i2 summed over the summed dims i3
    lacks (a GEMM: float32 accumulation, the result rounded to the tensors' dtype), that times i3 summed over
    the rest (rounded again); along a summed `unroll_dim` each slice's result is added into the output in
    turn (each sum rounded). torchax multiplied all three and summed once in the half type (bilinear
    float16: 4 of 5 OpInfo elements off CPU's). For float32 the same contractions, unrounded."""
    jax = _jax()
    jnp = jax.numpy
    dtype = jnp.result_type(i1, i2, i3)
    total = i1.ndim + len(expand1)
    e1, e2, e3 = ({int(d) % total for d in e} for e in (expand1, expand2, expand3))
    summed = {int(d) % total for d in sumdim}
    unroll = int(unroll_dim) % total
    half = dtype in (jnp.bfloat16, jnp.float16)
    wide = jnp.float32 if half else dtype

    def r(v: Any) -> Any:
        return half_rounded(v, dtype) if half else v

    def letters(expanded: set) -> str:
        return "".join(chr(97 + d) for d in range(total) if d not in expanded)

    l1, l2, l3 = letters(e1), letters(e2), letters(e3)
    sum12 = {d for d in summed if d in e3 and d != unroll}
    sum23 = {d for d in summed if d not in e3 and d != unroll}
    keep12 = "".join(c for c in sorted(set(l1) | set(l2)) if ord(c) - 97 not in sum12)
    hi = jax.lax.Precision.HIGHEST
    buf = r(jnp.einsum(f"{l1},{l2}->{keep12}", i1.astype(wide), i2.astype(wide), precision=hi))
    keep = "".join(c for c in sorted(set(keep12) | set(l3)) if ord(c) - 97 not in sum23)
    out = r(jnp.einsum(f"{keep12},{l3}->{keep}", buf, i3.astype(wide), precision=hi))
    u = chr(97 + unroll)
    if unroll in summed and u in keep:  # output.add_(buf) slice after slice
        axis = keep.index(u)
        out = jax.lax.scan(lambda acc, s: (r(acc + s), None), jnp.zeros_like(jnp.take(out, 0, axis)),
                           jnp.moveaxis(out, axis, 0))[0]
        keep = keep.replace(u, "")
    # dims absent from every operand and not summed are size 1; the summed dims are squeezed out
    shape = [1 if chr(97 + d) not in keep else out.shape[keep.index(chr(97 + d))]
             for d in range(total) if d not in summed]
    if 0 in (i1.size, i2.size, i3.size):
        return jnp.zeros(shape, dtype)
    return out.reshape(shape).astype(dtype)



@lowers(aten.prod.dim_int)
def _prod_dim(x: Any, dim: int, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """prod along a dim: for half inputs CPU's reduction kernel multiplies in the half type (binary_kernel_reduce_vec
    with `a * b` on scalar_t), each product rounded, in order along the dim where the dim is not the innermost
    or shorter than a vector (measured bit-equal on (1000, 4) along dim 0, (50, 30) along either, (6, 17) and
    OpInfo's (5, 5, 5)); XLA's product of float32 values rounded once put 8 of 25 float16 OpInfo elements an ulp
    off, and prod's gradient (result / input) carried it. Other dtypes: a plain product."""
    jax = _jax()
    jnp = jax.numpy
    if dtype is not None:
        from hf_tpu import dtypes

        x = x.astype(dtypes.to_jax(dtype) if isinstance(dtype, torch.dtype) else dtype)
    if x.ndim == 0:
        return x
    dim %= x.ndim
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        if x.dtype == jnp.bool_:
            x = x.astype(jnp.int64)
        elif jnp.issubdtype(x.dtype, jnp.integer):
            x = x.astype(jnp.int64)  # PyTorch's prod of an integer tensor is int64
        return jnp.prod(x, axis=dim, keepdims=keepdim)
    half = x.dtype
    inner = all(s == 1 for s in x.shape[dim + 1:])
    if inner and x.shape[dim] >= _vector_block():
        # a long contiguous row: CPU multiplies vector lanes (Vectorized<Half>) and combines them, an order not
        # emulated here; float32 rounded once, as before
        return jnp.prod(x.astype(jnp.float32), axis=dim, keepdims=keepdim).astype(half)
    moved = jnp.moveaxis(x.astype(jnp.float32), dim, 0)
    out = jax.lax.scan(lambda acc, v: (half_rounded(acc * v, half), None), jnp.ones(moved.shape[1:], jnp.float32),
                       moved)[0].astype(half)
    return jnp.expand_dims(out, dim) if keepdim else out


def _pool_axis(out_size: int, in_size: int, k: int, stride: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """One axis of avg_pool2d's windows as CPU's kernel clips them: per output position (start, end) of the window
    clipped to the input, and the window's length before that clip (clipped to input + padding only)."""
    start = np.arange(out_size) * stride - pad
    end_padded = np.minimum(start + k, in_size + pad)
    return np.stack([np.maximum(start, 0), np.minimum(end_padded, in_size)]), end_padded - start


def _window_of(idx: np.ndarray, d: int, pad: int, stride: int, n_out: int, starts: np.ndarray,
               ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis: the output position whose window holds input position `idx` at offset `d`
    (out * stride - pad + d == idx), clipped into range, and whether that window really holds it."""
    num = idx + pad - d
    out = num // stride
    ok = (num % stride == 0) & (out >= 0) & (out < n_out)
    out = np.clip(out, 0, max(n_out - 1, 0))
    return out, ok & (idx >= starts[out]) & (idx < ends[out])


def avg_pool2d_backward(grad: Any, x: Any, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                        count_include_pad: bool, divisor_override: Any) -> Any:
    """CPU's avg_pool2d backward for half inputs (cpu_avg_pool2d_backward): per output position in (oh, ow)
    order, `scalar_t grad_delta = grad_output / divide_factor` (rounded) is added (`+=`, rounded) to every input
    element of its window. The float32 VJP rounds each input gradient once, 1 ulp off where several windows
    overlap (local_response_norm's (size, 1) pool: 21 of 21 elements). An input element's contributions come in
    increasing (oh, ow), that is decreasing window offset (kh, kw): the loop runs the offsets that way."""
    jnp = _jax().numpy
    half = grad.dtype
    kh, kw = (tuple(kernel_size) * 2)[:2] if len(kernel_size) == 1 else tuple(kernel_size)
    sh, sw = (kh, kw) if not stride else ((tuple(stride) * 2)[:2] if len(stride) == 1 else tuple(stride))
    ph, pw = (tuple(padding) * 2)[:2] if len(padding) == 1 else tuple(padding)
    h, w = x.shape[-2:]
    oh, ow = grad.shape[-2:]
    (hs, he), hpool = _pool_axis(oh, h, kh, sh, ph)
    (ws, we), wpool = _pool_axis(ow, w, kw, sw, pw)
    if divisor_override:
        divisor = np.full((oh, ow), float(divisor_override))
    elif count_include_pad:
        divisor = np.outer(hpool, wpool).astype(np.float64)
    else:
        divisor = np.outer(he - hs, we - ws).astype(np.float64)
    delta = half_rounded(grad.astype(jnp.float32) / jnp.asarray(divisor, jnp.float32), half)
    gin = jnp.zeros((*x.shape[:-2], h, w), jnp.float32)
    ih, iw = np.arange(h), np.arange(w)
    for dh in reversed(range(kh)):
        o_h, ok_h = _window_of(ih, dh, ph, sh, oh, hs, he)
        for dw in reversed(range(kw)):
            o_w, ok_w = _window_of(iw, dw, pw, sw, ow, ws, we)
            ok = np.outer(ok_h, ok_w)
            if not ok.any():
                continue
            term = delta[..., o_h[:, None], o_w[None, :]]
            gin = jnp.where(jnp.asarray(ok), half_rounded(gin + term, half), gin)
    return gin.astype(half)
