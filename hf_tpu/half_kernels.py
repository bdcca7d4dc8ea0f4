"""Half-precision lowerings written as CPU's kernels round, where neither float32 throughout (lowering_parity's
OPMATH and pointwise rule) nor XLA's half arithmetic gives CPU's bits (found by tests/hf_tpu/op_parity.py):

  _log_softmax   -> float32, except that the last-dimension kernel rounds the sum and its log to the half type
                    (float32 rows longer than torch_dot_ffi.LONG_ROW, and _log_softmax_backward_data's, which
                    sits here beside it, take PyTorch's kernels)
  pow.Tensor_Scalar -> CPU's special exponents (x * x, 1 / sqrt...) and its bfloat16 step-by-step rounding
  logit          -> each step rounded to the half type (a kernel written on Vectorized<Half/BFloat16>)
  rsqrt          -> CPU's vectorised and scalar loops by element position (see _rsqrt)
  native_layer_norm -> float32 throughout; the saved mean and rstd in CPU's dtype (op_dtypes' lowering_dtypes)

The ops flagged half_as_written here are exempt from lowering.find's float32-throughout pointwise rule.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import op_registry, torch_dot_ffi
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
        long_rows = torch_dot_ffi.log_softmax(x, dim)  # float32 rows too long for XLA:CPU's reduction
        return jax.nn.log_softmax(x, dim) if long_rows is None else long_rows
    half, xf = x.dtype, x.astype(jnp.float32)
    shifted = xf - jnp.max(xf, axis=dim, keepdims=True)
    total = jnp.sum(jnp.exp(shifted), axis=dim, keepdims=True)
    if all(s == 1 for s in x.shape[dim + 1:]):  # inner size 1: CPU's _vec_log_softmax_lastdim
        lse = jnp.log(total.astype(half).astype(jnp.float32)).astype(half).astype(jnp.float32)
    else:
        lse = jnp.log(total)
    return (shifted - lse).astype(half)


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad: Any, out: Any, dim: int, input_dtype: Any) -> Any:
    """grad - exp(out) * sum(grad) (PyTorch's decomposition and CPU kernel), except float32 rows too long for
    XLA:CPU's reduction (torch_dot_ffi.LONG_ROW), which take PyTorch's kernel; half inputs arrive in float32
    (the op is OPMATH: CPU computes them so)."""
    long_rows = torch_dot_ffi.log_softmax_backward(grad, out, dim)
    if long_rows is not None:
        return long_rows
    jnp = _jax().numpy
    return grad - jnp.exp(out) * jnp.sum(grad, axis=dim, keepdims=True)


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


def half_rounded(x: Any, half: Any) -> Any:
    """float32 `x` rounded to the half type `half` and kept in float32: a step of a CPU kernel that rounds each
    operation (Vectorized<Half/BFloat16> arithmetic). For float16 where XLA:CPU merges rounded steps into one
    fused multiply-add (xla_options.fuses_half_multiply_adds) the rounding is a reduce_precision, which LLVM
    cannot merge; the results must not depend on the host. reduce_precision flushes float16's subnormals, so
    those keep the plain conversion."""
    from hf_tpu import xla_options

    jax = _jax()
    jnp = jax.numpy
    plain = x.astype(half).astype(jnp.float32)
    if half != jnp.float16 or not xla_options.fuses_half_multiply_adds():
        return plain
    guarded = jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10)
    return jnp.where(jnp.abs(x) < 2.0 ** -14, plain, guarded)


def _half_scalar(v: Any, half: Any) -> float:
    """A Python scalar as CPU's kernels take it for a half tensor (Scalar::to<Half/BFloat16>)."""
    import numpy as np

    return float(np.asarray(v, dtype=half))


@lowers(aten.addr.default)
def _addr(x: Any, vec1: Any, vec2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """CPU's addr kernel, `beta * self + alpha * vec1 * vec2` evaluated left to right in the result's dtype
    (each step of a half type rounded to it: Vectorized<Half/BFloat16>), self ignored when beta is 0, and for
    bool `(beta && self) || (alpha && vec1 && vec2)`. PyTorch's decomposition (torch._refs.addr) computes the
    outer product first and, for half types, XLA evaluated it in float32 and rounded once: 1 float16 ulp off."""
    jnp = _jax().numpy
    dtype = jnp.result_type(x, vec1, vec2)
    x, col, row = x.astype(dtype), vec1.astype(dtype)[:, None], vec2.astype(dtype)[None, :]
    shape = jnp.broadcast_shapes(x.shape, (col.shape[0], row.shape[1]))
    if dtype == jnp.bool_:
        prod = bool(alpha) & col & row
        out = prod | (x & True) if bool(beta) else prod
    elif dtype in (jnp.bfloat16, jnp.float16):
        f32 = jnp.float32
        a, b = _half_scalar(alpha, dtype), _half_scalar(beta, dtype)
        prod = half_rounded(half_rounded(a * col.astype(f32), dtype) * row.astype(f32), dtype)
        out = prod if b == 0 else half_rounded(half_rounded(b * x.astype(f32), dtype) + prod, dtype)
        out = out.astype(dtype)
    else:
        a, b = jnp.asarray(alpha, dtype), jnp.asarray(beta, dtype)
        prod = a * col * row
        out = prod if beta == 0 else b * x + prod
    return jnp.broadcast_to(out, shape)


@lowers(aten.addbmm.default)
def _addbmm(x: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """CPU's addbmm: one addmm_ per batch into the result (addbmm_impl_: beta for the first, 1 after), so a
    half-typed result is rounded after every batch, each addmm computing beta * c + alpha * (b1[i] @ b2[i])
    in float32 and rounding once. torchax summed all batches in one einsum, rounded once (float16: 3-7 of 50
    elements outside tolerance). Other dtypes: the same sequence without roundings to a narrower type."""
    jax = _jax()
    jnp = jax.numpy
    dtype = jnp.result_type(x, batch1, batch2)
    half = dtype in (jnp.bfloat16, jnp.float16)
    wide = jnp.float32 if half else dtype
    shape = (batch1.shape[1], batch2.shape[2])
    c = jnp.zeros(shape, wide) if beta == 0 else jnp.broadcast_to(
        jnp.asarray(beta, wide) * x.astype(wide), shape)
    if batch1.shape[0] == 0:
        return c.astype(dtype)
    prods = jnp.einsum("bxy,byz->bxz", batch1.astype(wide), batch2.astype(wide),
                       precision=jax.lax.Precision.HIGHEST)
    a = jnp.asarray(alpha, wide)

    def step(acc: Any, p: Any) -> tuple[Any, None]:
        nxt = acc + a * p
        return (half_rounded(nxt, dtype) if half else nxt), None

    first = step(c, prods[0])[0]
    return jax.lax.scan(step, first, prods[1:])[0].astype(dtype)
