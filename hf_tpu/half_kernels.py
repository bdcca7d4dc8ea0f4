"""Half-precision lowerings written as CPU's kernels round, where neither float32 throughout (lowering_parity's
OPMATH and pointwise rule) nor XLA's half arithmetic gives CPU's bits (found by tests/hf_tpu/op_parity.py):

  _log_softmax   -> float32, except that the last-dimension kernel rounds the sum and its log to the half type
  pow.Tensor_Scalar -> CPU's special exponents (x * x, 1 / sqrt...) and its bfloat16 step-by-step rounding
  logit          -> each step rounded to the half type (a kernel written on Vectorized<Half/BFloat16>)
  rsqrt          -> CPU's vectorised and scalar loops by element position (see _rsqrt)
  native_layer_norm -> float32 throughout; the saved mean and rstd in CPU's dtype (op_dtypes' lowering_dtypes)

The ops flagged half_as_written here are exempt from lowering.find's float32-throughout pointwise rule.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import op_registry
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


@lowers(aten._log_softmax.default)
def _log_softmax(x: Any, dim: int, half_to_float: bool = False) -> Any:
    """CPU's log_softmax: for half inputs max, exponentials and sum in float32 and the result rounded once,
    except that its last-dimension kernel keeps the sum and then its log in the half type (measured: bit-equal
    on bfloat16 and float16 where float32 throughout was 30-50 ulps-of-1 elements off per 400)."""
    jax = _jax()
    jnp = jax.numpy
    if x.ndim == 0:
        return jnp.zeros((), x.dtype)
    dim %= x.ndim
    if x.dtype not in (jnp.bfloat16, jnp.float16) or x.size == 0:
        return jax.nn.log_softmax(x, dim)
    half, xf = x.dtype, x.astype(jnp.float32)
    shifted = xf - jnp.max(xf, axis=dim, keepdims=True)
    total = jnp.sum(jnp.exp(shifted), axis=dim, keepdims=True)
    if all(s == 1 for s in x.shape[dim + 1:]):  # inner size 1: CPU's _vec_log_softmax_lastdim
        lse = jnp.log(total.astype(half).astype(jnp.float32)).astype(half).astype(jnp.float32)
    else:
        lse = jnp.log(total)
    return (shifted - lse).astype(half)


@lowers(aten.pow.Tensor_Scalar)
def _pow_tensor_scalar(x: Any, exponent: Any) -> Any:
    """CPU's pow(tensor, scalar) on floating tensors: exponents 2, 3, -2 as products (0.5, -0.5, -1 as sqrt,
    1 / sqrt, 1 / x), each step rounded to bfloat16 for bfloat16 (Vectorized<BFloat16> arithmetic), float16 as
    one float32 pow rounded once (its exponent rounded to float16 first, as exp_scalar.to<Half>()); XLA's pow
    is exp(e * log x), ulps off even in float32."""
    import numpy as np

    jnp = _jax().numpy
    if not (jnp.issubdtype(x.dtype, jnp.floating) and isinstance(exponent, (int, float))
            and not isinstance(exponent, bool)):
        from hf_tpu.torchax_compat import load_op_table

        table = load_op_table()[0]
        return (table.get(aten.pow.Tensor_Scalar) or table[aten.pow]).func(x, exponent)
    dtype = x.dtype
    if dtype == jnp.float16:
        return jnp.power(x.astype(jnp.float32), float(np.float16(exponent))).astype(dtype)
    bf16 = dtype == jnp.bfloat16
    r = (lambda v: v.astype(dtype).astype(jnp.float32)) if bf16 else (lambda v: v)
    xf = x.astype(jnp.float32) if bf16 else x
    e = float(np.asarray(exponent, dtype=dtype)) if bf16 else float(exponent)
    if e == 0.5:
        out = jnp.sqrt(xf)
    elif e == -0.5:
        out = 1 / jnp.sqrt(xf)
    elif e == -1:
        out = 1 / xf
    elif e == 2:
        out = xf * xf
    elif e == 3:
        out = r(xf * xf) * xf
    elif e == -2:
        out = 1 / r(xf * xf)
    else:
        out = jnp.power(xf, jnp.asarray(e, xf.dtype))
    return out.astype(dtype)


@lowers(aten.logit.default)
def _logit(x: Any, eps: float | None = None) -> Any:
    """CPU's logit: for half inputs each step of log(x / (1 - x)) rounded to the half type (its kernel is
    written on Vectorized<Half/BFloat16>), with eps clamping to [eps, 1 - eps] in that type."""
    jnp = _jax().numpy
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        from hf_tpu.torchax_compat import load_op_table

        table = load_op_table()[0]
        return (table.get(aten.logit.default) or table[aten.logit]).func(x, eps)
    half = x.dtype

    def r(v: Any) -> Any:
        return jnp.asarray(v, jnp.float32).astype(half).astype(jnp.float32)

    xf = x.astype(jnp.float32)
    if eps is not None:
        lo = r(eps)
        xf = jnp.clip(xf, lo, r(1 - lo))
    return jnp.log(r(xf / r(1 - xf))).astype(half)


def _vector_block() -> int:
    """Elements per step of CPU's vectorised loop for a half type (Vectorized<Half/BFloat16> on this CPU)."""
    return 32 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 16


def _half_sqrt(x: Any) -> Any:
    """sqrt(x) correctly rounded to x's half type. float32's sqrt rounded again to the half type can land on
    the wrong side of a half-way point (double rounding); the half-way points between neighbours have at most
    12 significant bits, so their squares are exact in float32 and decide the side exactly."""
    jnp = _jax().numpy
    xf = x.astype(jnp.float32)
    h = jnp.sqrt(xf).astype(x.dtype)
    up, down = jnp.nextafter(h, jnp.asarray(jnp.inf, x.dtype)), jnp.nextafter(h, jnp.asarray(0, x.dtype))
    hf, upf, downf = h.astype(jnp.float32), up.astype(jnp.float32), down.astype(jnp.float32)
    mid_up, mid_down = (hf + upf) * 0.5, (hf + downf) * 0.5
    finite = jnp.isfinite(xf) & (xf > 0)
    h = jnp.where(finite & (xf > mid_up * mid_up), up, h)
    return jnp.where(finite & (xf < mid_down * mid_down) & (h.astype(jnp.float32) == hf), down, h)


@lowers(aten.rsqrt.default)
def _rsqrt(x: Any) -> Any:
    """CPU's rsqrt kernel for float16/bfloat16 takes each element one of two ways by its position: the
    vectorised loop (blocks of _vector_block() elements) computes 1 / sqrt in float32 and rounds once, and
    the scalar loop for the elements left after the last whole block computes `Half(1) / std::sqrt(a)`: sqrt
    rounded to the half type, then 1 / it in float32 rounded again (measured bit-equal on every positive
    float16, 30,720 values, both ways). Positions are in row-major order (tpu tensors are contiguous); above
    at::internal::GRAIN_SIZE elements CPU splits the range over its threads and each chunk has its own tail,
    as here. Either formula alone is 1 ulp off on ~27% (float32 once, on short tensors' tails) or on the
    vectorised part (XLA's half rsqrt, which the eager lowering was until this, and which compiled graphs
    computed the other way: acos's float16 gradient differed compiled only)."""
    jax = _jax()
    jnp = jax.numpy
    if x.dtype not in (jnp.float16, jnp.bfloat16) or x.size == 0:
        return jax.lax.rsqrt(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jax.lax.rsqrt(x.astype(jnp.float32))
    xf = x.astype(jnp.float32)
    vector = (1.0 / jnp.sqrt(xf)).astype(x.dtype)
    scalar = (1.0 / _half_sqrt(x).astype(jnp.float32)).astype(x.dtype)
    n, block = x.size, _vector_block()
    grain, threads = 32768, max(torch.get_num_threads(), 1)
    tasks = min(threads, -(-n // grain)) if n >= grain else 1
    chunk = -(-n // tasks)
    pos = jnp.arange(n, dtype=jnp.int32)
    start = (pos // chunk) * chunk
    length = jnp.minimum(start + chunk, n) - start
    in_tail = (pos - start) >= (length - length % block)
    return jnp.where(in_tail.reshape(x.shape), scalar, vector)


# logit, pow.Tensor_Scalar and rsqrt round their half steps as written above, not float32 throughout
op_registry.mark("half_as_written", {aten.pow.Tensor_Scalar, aten.rsqrt.default, aten.logit.default})


@lowers(aten.native_layer_norm.default)
def _native_layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                       eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """CPU's layer norm on half inputs: statistics and result in float32, the result rounded once to the input's
    dtype, and the saved mean and rstd to the input's dtype too, or the weight's when they differ (CPU's
    mixed-type kernel). The meta kernel says float32 statistics (CUDA's), which eager gave for bfloat16 and
    float16 inputs: a dtype CPU does not give (op_dtypes._LOWERING_DTYPES takes this lowering's instead).
    CPU's backward reads those rounded statistics, and so does the decomposition here."""
    from hf_tpu.torchax_compat import load_op_table

    jnp = _jax().numpy
    table = load_op_table()[0]
    base = (table.get(aten.native_layer_norm.default) or table[aten.native_layer_norm]).func
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        return base(x, normalized_shape, weight, bias, eps)
    stats = weight.dtype if weight is not None and weight.dtype != x.dtype else x.dtype
    up = [None if t is None else t.astype(jnp.float32) for t in (x, weight, bias)]
    out, mean, rstd = base(up[0], normalized_shape, up[1], up[2], eps)
    return out.astype(x.dtype), mean.astype(stats), rstd.astype(stats)
