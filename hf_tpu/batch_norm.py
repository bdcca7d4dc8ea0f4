"""Batch norm as CPU's kernels compute it (aten/src/ATen/native/cpu/batch_norm_kernel.cpp and
Normalization.cpp's batch_norm_cpu_update_stats_template), forward and backward, for contiguous inputs:

  statistics   float32/float16/bfloat16 inputs: sums in float32 in CPU's order (see _cpu_sum); a half input with
               half parameters keeps mean and the variance sum in the half type and divides there
               (`var_sum / n` is c10 half arithmetic: n and the quotient rounded to it), then
               invstd = 1 / sqrt(var + eps) in float32, rounded to the half type; float32 inputs accumulate
               in double and take invstd in double (acc_type<float> is double), as CPU does
  running stats momentum * mean + (1 - momentum) * running, each step in the parameters' arithmetic (c10 half
               operators round every step; float32 parameters: float, the unbiased variance term in double)
  output       x * alpha + beta per channel, alpha = invstd * weight, beta = bias - mean * alpha, in float32,
               rounded once
  backward     sum(dy) and sum((x - mean) * dy) in CPU's order, then
               dx = (dy - sum / N - (x - mean) * (dotp * invstd * invstd / N)) * invstd * w in float32,
               rounded once; grad_weight = dotp * invstd, grad_bias = sum in the parameters' dtype

Before this, statistics were float32 means rounded once (a bfloat16 invstd an ulp off CPU's for ~1 in 8
channels, so 21 of 120 outputs of a (6, 4, 5) input) and the backward was PyTorch's decomposition in float32
(another order of the same terms): bfloat16 input gradients an ulp off CPU's, eager and compiled.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_tpu.half_kernels import _vector_block
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def fma(a: Any, b: Any, c: Any) -> Any:
    """a * b + c rounded once, as CPU's kernels compute it: PyTorch's CPU kernels are compiled with GCC's
    default -ffp-contract=fast, so `x * alpha + beta` and `acc += d * d` are fused multiply-adds (measured:
    float32 batch norm in eval, 0 of 3,136 outputs off fused, 1,186 off unfused). float32 operands through
    float64 (their product is exact there; the sum rounds twice, off only for a float64 result within 2^-29
    of a float32 half-way point); float64 operands unfused."""
    jnp = _jax().numpy
    dtype = jnp.result_type(a, b, c)
    if dtype != jnp.float32:
        return a * b + c
    f64 = jnp.float64
    return (jnp.asarray(a).astype(f64) * jnp.asarray(b).astype(f64) + jnp.asarray(c).astype(f64)).astype(dtype)


def recip_sqrt(v: Any) -> Any:
    """1 / sqrt(v), each step correctly rounded, as C's `1 / std::sqrt(v)`. Inside a jitted program XLA's
    algebraic simplifier rewrites divide(1, sqrt(v)) into rsqrt(v), which is not correctly rounded (float32
    batch norm in eval: 453 of 1,024 outputs off CPU's through an invstd an ulp off); the optimisation barrier
    keeps the square root a value of its own."""
    jax = _jax()
    return 1 / jax.lax.optimization_barrier(jax.numpy.sqrt(v))


def exact_div(a: Any, b: Any) -> Any:
    """a / b correctly rounded when b is a scalar or broadcasts: XLA's algebraic simplifier turns
    a / broadcast(b) into a * broadcast(1 / b), an ulp off on ~25% of float32 elements (x / 196: 25,052 of
    100,000). The divisor made a full array behind an optimisation barrier is no broadcast."""
    jax = _jax()
    jnp = jax.numpy
    a = jnp.asarray(a)
    b = jnp.broadcast_to(jnp.asarray(b, a.dtype), a.shape)
    return a / jax.lax.optimization_barrier(b)


def _sequential(v: Any, axis: int, step: Any = None, init: Any = None) -> Any:
    """Left-to-right fold along `axis` (a C loop's `acc += v[i]`, or `acc = step(acc, v[i])`), whatever XLA would
    reorder; `init`: the accumulator's start (default: the first element, which 0 + v[0] equals)."""
    jax = _jax()
    jnp = jax.numpy
    step = step or (lambda acc, x: acc + x)
    v = jnp.moveaxis(v, axis, 0) if not isinstance(v, tuple) else tuple(jnp.moveaxis(t, axis, 0) for t in v)
    first = v if not isinstance(v, tuple) else v[0]
    if init is None:
        if first.shape[0] == 0:
            return jnp.zeros(first.shape[1:], first.dtype)
        head = v[0] if not isinstance(v, tuple) else step(jnp.zeros(first.shape[1:], first.dtype), tuple(t[0] for t in v))
        rest = v[1:] if not isinstance(v, tuple) else tuple(t[1:] for t in v)
        return jax.lax.scan(lambda acc, x: (step(acc, x), None), head, rest, unroll=8)[0]
    return jax.lax.scan(lambda acc, x: (step(acc, x), None), init, v, unroll=8)[0]


def _cpu_sum(v: Any, w: Any = None) -> Any:
    """Per-channel float32 sums of v (C, n_batch, image), or of the products v * w fused into the accumulation
    (`acc += a * b`, an FMA), in the order of CPU's reduced-precision contiguous batch-norm kernels: for each
    batch row, whole blocks of the vectorised loop (Vectorized<Half/BFloat16>, 2 x L lanes) go into an L-lane
    float32 accumulator (the block's first L elements, then its last L), the row's remaining elements into a
    scalar sum; at the end scalar + the lanes added one after another (vec_reduce_all with a size)."""
    jnp = _jax().numpy
    c, rows, image = v.shape
    block = _vector_block()
    lanes = block // 2
    whole = image - image % block

    def split(t: Any) -> tuple[Any, Any]:
        return (t[:, :, :whole].reshape(c, rows * (whole // block) * 2, lanes), t[:, :, whole:].reshape(c, -1))

    zero_lanes, zero = jnp.zeros((c, lanes), jnp.float32), jnp.zeros((c,), jnp.float32)
    if w is None:
        (vector, tail) = split(v)
        acc = _sequential(vector, 1, init=zero_lanes)
        scalar = _sequential(tail, 1, init=zero)
    else:
        (va, ta), (vb, tb) = split(v), split(w)
        step = lambda acc, ab: fma(ab[0], ab[1], acc)  # noqa: E731
        acc = _sequential((va, vb), 1, step, init=zero_lanes)
        scalar = _sequential((ta, tb), 1, step, init=zero)
    return scalar + _sequential(acc, 1)


def _row_reduce_all(v: Any, w: Any = None) -> Any:
    """float32 per-row sums of v (C, rows, image) (or of v * w, fused) as CPU's vec::reduce_all /
    map2_reduce_all compute them (Vectorized<float>, L lanes): a row shorter than L added left to right; else
    the first L elements start the lanes, each further whole block is added lane by lane (a partial last block
    only into its lanes), and the lanes are reduced by the SIMD tree (lane i with i ^ L/2, then L/4, ... 1)."""
    jnp = _jax().numpy
    c, rows, image = v.shape
    lanes = _vector_block() // 2
    prod = v if w is None else None
    if image < lanes:
        if w is None:
            return _sequential(v, 2)
        return _sequential((v, w), 2, lambda acc, ab: fma(ab[0], ab[1], acc))
    blocks = -(-image // lanes)
    pad = blocks * lanes - image

    def lanes_of(t: Any, fill: float) -> Any:
        t = jnp.pad(t, ((0, 0), (0, 0), (0, pad)), constant_values=fill)
        return t.reshape(c, rows, blocks, lanes)

    if w is None:
        a = lanes_of(prod, 0.0)
        acc = _sequential(a[:, :, 1:], 2, init=a[:, :, 0])
    else:
        a, b = lanes_of(v, 0.0), lanes_of(w, 0.0)
        acc = _sequential((a[:, :, 1:], b[:, :, 1:]), 2, lambda acc, ab: fma(ab[0], ab[1], acc), init=a[:, :, 0] * b[:, :, 0])
    # a padded lane added 0 (or fma with a zero product): unchanged, as the partial block leaves it
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc[..., 0]


def _channels(x: Any, dtype: Any) -> Any:
    """x (N, C, *) as (C, N, image) in `dtype`."""
    jnp = _jax().numpy
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1], -1), 1, 0).astype(dtype)


def _back(v: Any, shape: tuple) -> Any:
    jnp = _jax().numpy
    return jnp.moveaxis(v, 0, 1).reshape(shape)


def _half(x: Any) -> bool:
    jnp = _jax().numpy
    return x.dtype in (jnp.bfloat16, jnp.float16)


def _mixed(x: Any, params: tuple) -> bool:
    """CPU's is_mixed_type: a half input with float32 parameters (statistics kept in float32)."""
    jnp = _jax().numpy
    return _half(x) and any(p is not None and p.dtype == jnp.float32 for p in params)


def _bn_transform(x: Any, weight: Any, bias: Any, mean: Any, invstd: Any) -> Any:
    """x * alpha + beta per channel (alpha = invstd * weight, beta = bias - mean * alpha, both fused), in float32
    (float64 for float64) and rounded once to x's dtype: CPU's batch-norm kernel for every dtype."""
    jnp = _jax().numpy
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    alpha = invstd.astype(wide) * (jnp.asarray(1, wide) if weight is None else weight.astype(wide))
    beta = fma(-mean.astype(wide), alpha, jnp.asarray(0, wide) if bias is None else bias.astype(wide))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return fma(x.astype(wide), alpha.reshape(shape), beta.reshape(shape)).astype(x.dtype)


def batch_norm_eval(x: Any, weight: Any, bias: Any, mean: Any, var: Any, eps: float) -> tuple[Any, Any, Any]:
    """Inference batch norm (running statistics): invstd = 1 / sqrt(var + eps) in float32 (float64 for float64);
    the saved statistics are empty, as CPU returns them: in the parameters' dtype (float32 for a half input
    with float32 parameters, as in training)."""
    jnp = _jax().numpy
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    invstd = recip_sqrt(var.astype(wide) + jnp.asarray(eps, wide))
    empty = jnp.zeros((0,), jnp.float32 if _mixed(x, (weight, bias, mean, var)) else x.dtype)
    return _bn_transform(x, weight, bias, mean, invstd), empty, empty


def _inv_std(var: Any, eps: float, dtype: Any) -> Any:
    """CPU's InvStd in `dtype` arithmetic: 1 / sqrt(var + eps), and 0 (not inf) for a zero variance with eps 0."""
    jnp = _jax().numpy
    v = var.astype(dtype)
    out = recip_sqrt(v + jnp.asarray(eps, dtype))
    return jnp.where(v == 0, jnp.zeros_like(out), out) if eps == 0 else out


def _statistics(x: Any, eps: float, mixed: bool) -> tuple[Any, Any, Any]:
    """(mean, invstd, variance sum) as batch_norm_cpu_collect_stats + update_stats_template compute them; mean and
    invstd in CPU's saved dtype. float32/float64: sums in double (acc_type), the mean and the variance sum
    stored in the input's type, invstd in double. bfloat16 with bfloat16 parameters: sums in float32 in the
    vectorised kernel's order, the variance sum kept in bfloat16 and divided there (c10 arithmetic: bf16 / n),
    invstd in float32. float16 (measured: CPU's float16 statistics are float32 throughout, rounded once when
    stored) and half inputs with float32 parameters: the same sums, float32 from there."""
    jnp = _jax().numpy
    f32, f64 = jnp.float32, jnp.float64
    n = x.size // x.shape[1]
    if x.dtype in (f32, f64):
        xc = _channels(x, x.dtype)
        mean = exact_div(xc.astype(f64).sum((1, 2)), n).astype(x.dtype)
        d = xc - mean[:, None, None]
        var_sum = (d * d).astype(f64).sum((1, 2)).astype(x.dtype)  # float products, added in double
        var = exact_div(var_sum, n)
        return mean, _inv_std(var, eps, f64).astype(x.dtype), var_sum
    xc = _channels(x, f32)
    mean_f = exact_div(_cpu_sum(xc), n)
    d = xc - mean_f[:, None, None]
    var_sum = _cpu_sum(d, d)
    keep = f32 if mixed else x.dtype
    if mixed or x.dtype == jnp.float16:
        invstd = _inv_std(exact_div(var_sum, n), eps, f32)
        return mean_f.astype(keep), invstd.astype(keep), var_sum.astype(keep)
    half = x.dtype
    var_sum = var_sum.astype(half)
    var = exact_div(var_sum.astype(f32), float(np.asarray(n, dtype=half))).astype(half)  # c10: half / int64 -> half
    return mean_f.astype(half), _inv_std(var, eps, f32).astype(half), var_sum


def batch_norm_train(x: Any, weight: Any, bias: Any, eps: float, params: tuple) -> tuple[Any, Any, Any, Any]:
    """(out, batch mean, batch invstd, variance sum). Statistics are kept in CPU's parameter dtype: the input's
    when every parameter (weight, bias, running statistics) has it, float32 when a half input comes with
    float32 parameters; the output is made from the kept (rounded) statistics."""
    mean, invstd, var_sum = _statistics(x, eps, _mixed(x, params))
    return _bn_transform(x, weight, bias, mean, invstd), mean, invstd, var_sum


def _running(x: Any, mean: Any, var_sum: Any, running_mean: Any, running_var: Any, momentum: float) -> tuple:
    """CPU's running-statistics update (update_stats_template): momentum * mean + (1 - momentum) * running in
    the parameters' arithmetic (bfloat16: c10 operators, each rounding; the unbiased variance term is
    bf16 * float -> float), float for float32 parameters with the variance term in double for a float32 input
    (acc_type<float>). float16 as float32, rounded once (measured, as its statistics). Unfused: this is
    Normalization.cpp, compiled for the baseline ISA (no FMA), unlike the kernels in native/cpu."""
    jnp = _jax().numpy
    f32, f64 = jnp.float32, jnp.float64
    n = x.size // x.shape[1]
    p = running_mean.dtype
    if p == jnp.bfloat16:
        def r(v: Any) -> Any:
            return v.astype(p).astype(f32)

        m = r(jnp.asarray(momentum, f32))
        one_minus = r(1 - m)
        new_mean = r(r(m * mean.astype(f32)) + r(one_minus * running_mean.astype(f32)))
        unbiased = r(exact_div(var_sum.astype(f32), float(np.asarray(n - 1, dtype=p))))  # bf16 / int64 -> bf16
        new_var = m * unbiased + r(one_minus * running_var.astype(f32))
        return new_mean.astype(p), new_var.astype(p)
    wide = f32 if p == jnp.float16 else p
    m = jnp.asarray(momentum, wide)
    rm, rv = running_mean.astype(wide), running_var.astype(wide)
    new_mean = (m * mean.astype(wide) + (1 - m) * rm).astype(p)
    unbiased = exact_div(var_sum.astype(wide), n - 1)
    if x.dtype == f32:  # acc_type<float>: the unbiased variance and the sum in double
        new_var = (m.astype(f64) * unbiased.astype(f64) + ((1 - m) * rv).astype(f64)).astype(p)
    else:
        new_var = (m * unbiased + (1 - m) * rv).astype(p)
    return new_mean, new_var


@lowers(aten.native_batch_norm.default)
def _native_batch_norm(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                       momentum: float, eps: float) -> Any:
    if not training and running_mean is not None and running_var is not None:
        return batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
    out, mean, invstd, _ = batch_norm_train(x, weight, bias, eps, (weight, bias, running_mean, running_var))
    return out, mean, invstd


@lowers(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                           momentum: float, eps: float) -> Any:
    """_native_batch_norm_legit_functional: also the new running statistics (unbiased variance)."""
    if not training:
        out, mean, invstd = batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
        return out, mean, invstd, running_mean, running_var
    out, mean, invstd, var_sum = batch_norm_train(x, weight, bias, eps, (weight, bias, running_mean, running_var))
    new_mean, new_var = _running(x, mean, var_sum, running_mean, running_var, momentum)
    return out, mean, invstd, new_mean, new_var


@lowers(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                       momentum: float, eps: float) -> Any:
    """_batch_norm_with_update as compiled graphs hold it (functionalized): CPU's arithmetic as eager's
    (functionalize.batch_norm_with_update), CPU's empty uint8 reserve, and the new running statistics. PyTorch's
    decomposition, which graphs used before, rounded a half input's output differently (0.125 off in bfloat16)."""
    jnp = _jax().numpy
    out, mean, invstd, new_mean, new_var = _batch_norm_functional(x, weight, bias, running_mean, running_var, True,
                                                                  momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


lowers(aten._native_batch_norm_legit_no_training.default)(
    lambda x, w, b, mean, var, momentum, eps: batch_norm_eval(x, w, b, mean, var, eps))
lowers(aten._native_batch_norm_legit.no_stats)(
    lambda x, w, b, training, momentum, eps: batch_norm_train(x, w, b, eps, (w, b))[:3])


@lowers(aten.native_batch_norm_backward.default)
def _native_batch_norm_backward(grad_out: Any, x: Any, weight: Any, running_mean: Any, running_var: Any,
                                save_mean: Any, save_invstd: Any, train: bool, eps: float,
                                output_mask: list[bool]) -> tuple[Any, Any, Any]:
    """CPU's batch_norm_cpu_backward (contiguous): see the module's docstring."""
    jnp = _jax().numpy
    f32, f64 = jnp.float32, jnp.float64
    wide = f64 if x.dtype == f64 else f32
    params = (weight, running_mean, running_var, save_mean, save_invstd)
    pdt = f32 if _mixed(x, params) else x.dtype
    if train:
        mean, invstd = save_mean.astype(wide), save_invstd.astype(wide)
    else:
        mean = running_mean.astype(wide)
        # `1 / std::sqrt(running_var[c] + eps)`: eps is a double, so the sum and the root are double
        invstd = recip_sqrt(running_var.astype(f64) + eps).astype(wide)
    w = jnp.ones_like(mean) if weight is None else weight.astype(wide)
    xc, dy = _channels(x, wide), _channels(grad_out, wide)
    n = xc.shape[1] * xc.shape[2]
    centred = xc - mean[:, None, None]
    if _half(x):
        total, dotp = _cpu_sum(dy), _cpu_sum(centred, dy)
    elif x.dtype == f32:  # per row vec::reduce_all / map2_reduce_all in float, the rows added in double
        total = _row_reduce_all(dy).astype(f64).sum(1)
        dotp = _row_reduce_all(centred, dy).astype(f64).sum(1)
    else:
        total, dotp = dy.sum((1, 2)), (centred * dy).sum((1, 2))
    grad_input = None
    if output_mask[0]:
        if train:
            k = exact_div(dotp.astype(wide) * invstd * invstd, n)
            grad_mean = exact_div(total, n).astype(wide)  # float32: a double divided, then stored in float
            dx = fma(-centred, k[:, None, None], dy - grad_mean[:, None, None])
            dx = dx * invstd[:, None, None] * w[:, None, None]
        else:
            dx = dy * invstd[:, None, None] * w[:, None, None]
        grad_input = _back(dx, x.shape).astype(x.dtype)
    # float32: `dotp * invstd` with dotp a double
    prod = f64 if x.dtype == f32 else wide
    grad_weight = (dotp.astype(prod) * invstd.astype(prod)).astype(pdt) if output_mask[1] else None
    grad_bias = total.astype(pdt) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias
