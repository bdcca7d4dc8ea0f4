"""Hand-written JAX lowerings found missing or wrong by the OpInfo parity test (tests/hf_tpu/op_parity.py),
registered with op_registry.lowers. Each exists because neither torchax 0.0.13 nor PyTorch's
decomposition table has a usable one:

  index_reduce   -> scatter prod/amin/amax/mean along `dim` (no lowering, no decomposition); mean divides by
                    the count as CPU's kernel does (floor division on integers)
  angle          -> atan2(imag, real) for complex; 0 or pi (NaN kept) for real inputs, in PyTorch's result dtype
  sign, sgn      -> bool passes through (jnp.sign rejects bool)
  _efficientzerotensor -> zeros (autograd's zero gradient of sgn and others; no ZeroTensor on tpu)
  linalg_cross   -> each product and the difference rounded to the input dtype, as CPU's kernel does
                    (PyTorch's decomposition computes half types in float32 and rounds once)
  as_strided_scatter -> a scatter at the strided positions (PyTorch's decomposition recursed forever on tpu)
  adaptive_max_pool2d/3d -> windows gathered and masked (PyTorch's decomposition takes only divisible sizes)
  _linalg_solve_ex -> LU and pivots returned too (linalg.solve's and eig's backwards reuse them)
  _linalg_eigvals -> jnp.linalg.eigvals (geev, CPU's order)
  linalg_lu, lu_unpack -> lax.linalg.lu / LAPACK's row swaps, P built from its permutation (torchax's slices by a traced size)
  polygamma      -> lax.polygamma with the arguments in the right order; digamma's pole as PyTorch's

OPMATH names the ops whose CPU kernels take bfloat16/float16 inputs through float32 (accumulating there) and
round the result once: lowering.find runs their lowering (or decomposition) on float32 operands and casts
back, instead of letting XLA accumulate in the half type (cumsum, norms, fmod differed by several ulps).
Every op tagged pointwise gets the same when its floating operands share one half type: CPU's vectorised
kernels convert half inputs to float32, evaluate, and round once, while XLA expands asinh, log1p, exp2,
gelu... in the half type, rounding each step (1-2 ulps off on ~5% of elements). Exact ops (add, where,
comparisons) are unchanged by it. Ops whose CPU kernels round otherwise are in half_kernels.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import linalg_lowerings, op_registry, xla_options
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


@lowers(aten.index_reduce.default)
def _index_reduce(x: Any, dim: int, index: Any, source: Any, reduce: str, *, include_self: bool = True) -> Any:
    """torch.index_reduce: x with source's slices along `dim` reduced into the positions `index` names."""
    jnp = _jax().numpy
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin, got {reduce}.")
    scalar = x.ndim == 0
    if scalar:
        x, source = x.reshape(1), source.reshape(1)
    dim = dim % x.ndim
    xt, st = jnp.moveaxis(x, dim, 0), jnp.moveaxis(source, dim, 0)
    idx = index.reshape(-1).astype(jnp.int32)
    if not include_self:  # the indexed slices start from the reduction's identity instead of x
        if reduce in ("prod",):
            ident = 1
        elif reduce == "mean":
            ident = 0
        elif jnp.issubdtype(x.dtype, jnp.floating):
            ident = jnp.inf if reduce == "amin" else -jnp.inf
        elif x.dtype == jnp.bool_:
            ident = reduce == "amin"
        else:
            info = jnp.iinfo(x.dtype)
            ident = info.max if reduce == "amin" else info.min
        xt = xt.at[idx].set(jnp.asarray(ident, x.dtype))
    at = xt.at[idx]
    if reduce == "prod":
        out = at.multiply(st)
    elif reduce == "amax":
        out = at.max(st)
    elif reduce == "amin":
        out = at.min(st)
    else:
        out = at.add(st)
        counts = jnp.full((xt.shape[0],), 1 if include_self else 0, jnp.int64).at[idx].add(1)
        counts = jnp.maximum(counts, 1).reshape((-1,) + (1,) * (xt.ndim - 1))
        if jnp.issubdtype(x.dtype, jnp.inexact):
            out = (out / counts.astype(out.dtype)).astype(x.dtype)
        else:
            out = jnp.floor_divide(out, counts.astype(out.dtype))
    out = jnp.moveaxis(out, 0, dim)
    return out.reshape(()) if scalar else out


@lowers(aten.angle.default)
def _angle(x: Any) -> Any:
    jnp = _jax().numpy
    if jnp.iscomplexobj(x):
        return jnp.arctan2(x.imag, x.real)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)  # PyTorch's result dtype for integer and bool inputs
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(jnp.pi, x.dtype), jnp.zeros((), x.dtype)))


@lowers(aten.sign.default, aten.sgn.default)
def _sign(x: Any) -> Any:
    jnp = _jax().numpy
    if x.dtype == jnp.bool_:
        return x
    if jnp.iscomplexobj(x):  # sgn: x / |x|, 0 at 0
        a = jnp.abs(x)
        return jnp.where(a == 0, jnp.zeros((), x.dtype), x / jnp.where(a == 0, 1, a).astype(x.dtype))
    return jnp.sign(x)


@lowers(aten.linalg_cross.default)
def _cross(a: Any, b: Any, dim: int = -1) -> Any:
    jax = _jax()
    jnp = jax.numpy
    a, b = jnp.broadcast_arrays(a, b)
    fwd, back = jnp.array([1, 2, 0]), jnp.array([2, 0, 1])
    half = a.dtype == jnp.float16
    if half:  # products exact in float32, then rounded to float16 explicitly (see below)
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    p = jnp.take(a, fwd, axis=dim) * jnp.take(b, back, axis=dim)
    q = jnp.take(a, back, axis=dim) * jnp.take(b, fwd, axis=dim)
    if not half:
        return p - q
    # XLA:CPU contracts a float16 multiply-subtract into one float32 fma (one rounding instead of CPU's three);
    # reduce_precision rounds each product to float16 where no contraction can skip it
    info = jnp.finfo(jnp.float16)
    p, q = (jax.lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant) for v in (p, q))
    return (p - q).astype(jnp.float16)


@lowers(aten.as_strided_scatter.default)
def _as_strided_scatter(x: Any, src: Any, size: Any, stride: Any, storage_offset: int | None = None) -> Any:
    """x (read as its contiguous storage) with the elements the strided view names replaced by src's."""
    import numpy as np

    jnp = _jax().numpy
    index = np.full(tuple(int(s) for s in size), int(storage_offset or 0), dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride, strict=True)):
        index = index + (np.arange(int(n)) * int(st)).reshape((int(n),) + (1,) * (len(size) - d - 1))
    flat = x.reshape(-1).at[jnp.asarray(index.reshape(-1))].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


@lowers(aten.polygamma.default)
def _polygamma(n: int, x: Any) -> Any:
    """polygamma(n, x) in x's floating dtype (float32 for integers and bool). JAX's is accurate only for x > 0:
    below, x is first shifted up past 0 by the recurrence psi_n(x) = psi_n(x + 1) + (-1)^(n+1) n! / x^(n+1)
    (PyTorch's Hurwitz-zeta series covers negative x the same way); poles give PyTorch's infinities: -inf
    for digamma at +0 (NaN below), (-1)^(n+1) inf for n >= 1."""
    import math

    jax = _jax()
    jnp = jax.numpy
    n = int(n)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    shift = jnp.where(x < 1, jnp.ceil(1 - x), 0)
    # PyTorch's series also takes about |x| steps; bounded so that a huge negative x cannot hang the device
    shift = jnp.where(jnp.isfinite(shift), jnp.minimum(shift, 1 << 20), 0)
    steps = jnp.max(shift, initial=0).astype(jnp.int32)
    sign = (-1.0) ** (n + 1) * math.factorial(n)

    def body(k: Any, acc: Any) -> Any:
        xk = x + k
        return acc + jnp.where(k < shift, sign / xk ** (n + 1), 0)

    acc = jax.lax.fori_loop(0, steps, body, jnp.zeros_like(x))
    base = x + shift
    psi = jax.scipy.special.digamma(base) if n == 0 else jax.lax.polygamma(jnp.asarray(n, x.dtype), base)
    out = psi + acc
    pole = (x <= 0) & (x == jnp.floor(x))
    if n == 0:
        at_pole = jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), jnp.nan)
    else:  # PyTorch: (-1)^(n+1) n! zeta(n + 1, x), and zeta is +inf at a pole: -inf for even n
        at_pole = jnp.asarray(jnp.inf if n % 2 else -jnp.inf, x.dtype)
    return jnp.where(pole, at_pole, out)


def _adaptive_max_pool(spatial: int) -> Callable[..., Any]:
    """adaptive_max_pool{2,3}d -> (values, flat indices within each plane). Window i along a dim of size n
    pooled to m spans [floor(i*n/m), ceil((i+1)*n/m)), as CPU's kernel; every window is gathered at the widest
    window's length, the extra positions masked (PyTorch's decomposition covers only divisible sizes)."""
    import numpy as np

    def pool(x: Any, output_size: Any) -> tuple[Any, Any]:
        jnp = _jax().numpy
        nlead = x.ndim - spatial
        sizes = x.shape[nlead:]
        outs = tuple(int(o) for o in output_size)
        v = x
        pos = np.zeros((1,) * (2 * spatial), np.int64)  # flat index in the plane, over (o1, k1, o2, k2, ...)
        valid = np.ones((1,) * (2 * spatial), bool)
        for d, (n, m) in enumerate(zip(sizes, outs, strict=True)):
            start = (np.arange(m) * n) // m
            end = -((-(np.arange(m) + 1) * n) // m)
            k = int((end - start).max())
            idx = start[:, None] + np.arange(k)[None, :]
            ok = idx < end[:, None]
            idx = np.minimum(idx, n - 1)
            axis = nlead + 2 * d  # the dims before it are already (out, k) pairs
            v = jnp.take(v, jnp.asarray(idx.reshape(-1)), axis=axis).reshape(v.shape[:axis] + (m, k) + v.shape[axis + 1:])
            shape = [1] * (2 * spatial)
            shape[2 * d], shape[2 * d + 1] = m, k
            pos = pos + (idx * int(np.prod(sizes[d + 1:], dtype=np.int64))).reshape(shape)
            valid = valid & ok.reshape(shape)
        # (..., o1, k1, o2, k2, ...) -> (..., o1, o2, ..., k1 * k2 * ...)
        order = [2 * d for d in range(spatial)] + [2 * d + 1 for d in range(spatial)]
        v = v.transpose(list(range(nlead)) + [nlead + p for p in order]).reshape(x.shape[:nlead] + outs + (-1,))
        pos = np.broadcast_to(pos, valid.shape if valid.size >= pos.size else pos.shape)
        pos, valid = np.broadcast_arrays(pos, valid)
        pos = pos.transpose(order).reshape(outs + (-1,))
        valid = valid.transpose(order).reshape(outs + (-1,))
        floating = jnp.issubdtype(v.dtype, jnp.floating)
        low = jnp.asarray(-jnp.inf if floating else jnp.iinfo(v.dtype).min, v.dtype)
        v = jnp.where(jnp.asarray(valid), v, low)
        # NaN wins, as in CPU's kernel (`val > max || isnan(val)`)
        best = jnp.argmax(jnp.where(jnp.isnan(v), jnp.inf, v) if floating else v, axis=-1)
        values = jnp.take_along_axis(v, best[..., None], axis=-1)[..., 0]
        indices = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(pos), v.shape), best[..., None], axis=-1)[..., 0]
        return values, indices.astype(jnp.int64)

    return pool


def opmath(fn: Callable[..., Any], pointwise: Any = None) -> Callable[..., Any]:
    """`fn` run on float32 copies of its bfloat16/float16 array operands, its float32 results rounded back to
    that half type (the first one found among the operands). For a pointwise op (`pointwise`: its schema),
    only when every floating operand has that one half type (a float32 operand makes the result float32), and
    a Python float where the schema takes a Tensor (add.Tensor(x, 0.1)) is first rounded to the half type, as
    PyTorch wraps it in a tensor of the common dtype (measured: x + 0.1 in float16 off CPU by an ulp otherwise)."""
    tensor_params = () if pointwise is None else tuple(
        (i, a.name) for i, a in enumerate(pointwise.arguments) if isinstance(a.type, torch.TensorType))
    unrounded_other = pointwise is not None and (pointwise.name, pointwise.overload_name) in (
        ("aten::mul", "Tensor"), ("aten::div", "Tensor"))

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        jnp = _jax().numpy
        leaves = pytree.tree_leaves((args, kwargs))
        half = next((x.dtype for x in leaves if hasattr(x, "dtype") and hasattr(x, "shape")
                     and x.dtype in (jnp.bfloat16, jnp.float16)), None)
        if pointwise is not None and half is not None and any(
                hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.inexact) and x.dtype != half for x in leaves):
            return fn(*args, **kwargs)
        if half is None or any(isinstance(x, torch.dtype) and str(x) != f"torch.{jnp.dtype(half).name}"
                               for x in leaves):
            # an explicit output dtype (cumsum(x, 0, dtype=float32), as autocast calls it): the input is cast to
            # it first (lowering._cast_input_first) and the result must stay in it. The half type itself
            # (_softmax_backward_data's input_dtype) keeps the rounding to it.
            return fn(*args, **kwargs)

        merge_guard = half == jnp.float16 and xla_options.fuses_half_multiply_adds()

        def down(x: Any) -> Any:
            if not (hasattr(x, "shape") and getattr(x, "dtype", None) == jnp.float32):
                return x
            if merge_guard:
                # rounded where XLA:CPU cannot fold it into a float16 FMA (xla_options); reduce_precision
                # flushes float16's subnormal range, which the select leaves to the plain conversion
                rounded = _jax().lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10)
                x = jnp.where(jnp.abs(x) < 2.0 ** -14, x, rounded)
            return x.astype(half)

        if tensor_params:
            import numpy as np

            def rounded(v: Any, to: Any = half) -> Any:
                return float(np.asarray(v, dtype=to)) if isinstance(v, float) else v

            # ...except mul's and div's second operand: CPU's reduced-float kernels for a scalar `other` take
            # its original value in float32 (iter.original_scalar_value<opmath_t>), so x * 0.7 in float16
            # multiplies by 0.7f (rounding 0.7 to float16 first put 421 of 1000 elements 1 ulp off)
            keep = unrounded_other
            args = tuple(rounded(a, np.float32) if i == 1 and keep else
                         rounded(a) if any(i == j for j, _ in tensor_params) else a for i, a in enumerate(args))
            kwargs = {k: rounded(v) if any(k == n for _, n in tensor_params) else v for k, v in kwargs.items()}
        # a dtype argument naming the half type itself (vector_norm(x, dtype=float16), as torch.masked calls
        # it) would make the lowering cast its float32 operands back to float16 and accumulate there (a norm
        # 1 ulp off CPU's); it computes in float32 like the rest and the result is rounded once below
        half_name = f"torch.{jnp.dtype(half).name}"

        def up(x: Any) -> Any:
            if isinstance(x, torch.dtype):
                return torch.float32 if str(x) == half_name else x
            return x.astype(jnp.float32) if hasattr(x, "shape") and getattr(x, "dtype", None) == half else x

        args, kwargs = pytree.tree_map(up, (args, kwargs))
        return pytree.tree_map(down, fn(*args, **kwargs))

    return wrapped


OPMATH = op_registry.mark("opmath", {
    aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default, aten.fmod.Tensor, aten.fmod.Scalar,
    aten.native_layer_norm_backward.default,  # (the forward is half_kernels' own: its statistics' dtypes)
    aten.native_group_norm.default, aten.native_group_norm_backward.default, aten.polygamma.default,
    # (the grid samplers are half_steps': every step in the half type, or float32 as here outside bilinear/zeros)
    # a Python scalar meets a half tensor in CPU's kernels at float32 (x * 2.302585 keeps the scalar's digits;
    # JAX would round it to the half type first): log10's and others' gradients
    aten.mul.Scalar, aten.div.Scalar, aten.add.Scalar, aten.sub.Scalar,
    aten.avg_pool2d.default, aten.avg_pool3d.default,
    # CPU's softmax kernels: max, sum of exponentials and the result in float32, rounded once
    aten._softmax.default, aten._softmax_backward_data.default, aten._log_softmax_backward_data.default,
    # CPU's kernels evaluate self + value * t1 * t2 (or / t2) in float32 and round once; a graph decomposed them
    # into half-typed mul/div/add with the scalar value rounded to the half type (addcmul f16: 995 of 1000
    # elements off, compiled only). As OPMATH ops they have a lowering, so graphs keep them whole too.
    aten.addcmul.default, aten.addcdiv.default,
    # CPU's half gemm computes beta * self + alpha * (mat1 @ mat2) in float32 and rounds once; torchax rounded
    # the product, then added in float16 (addmm f16 with alpha = beta = 1: 1 of 9 elements 2 ulps off).
    # bfloat16 operands take precision.wide_accumulation_matmul, which rounds once as well.
    aten.addmm.default,
    # CPU's norm kernels accumulate |x|^p for half inputs in float32 (acc_type) and round the root once; torchax
    # raised to the power in float16, which overflows for p > 2 (dist(p=4), vector_norm(ord=6) of 8.5: inf)
    aten.linalg_vector_norm.default, aten.dist.default,
    # CPU's half convolutions (oneDNN, or its slow path's float32 GEMM) accumulate in float32 and round once,
    # the bias added before that rounding; XLA:CPU's float16/bfloat16 convolution did not (conv_transpose3d
    # float16: 186 of 648 elements off CPU's, conv2d 4 of 27). Its backward (backward_lowerings) differentiates
    # this, so gradients are float32 too, rounded once.
    aten.convolution.default,
    # CPU's mish_backward evaluates dy * (tanh(softplus(x)) + x * sigmoid(x) * (1 - tanh^2)) in float32 for half
    # inputs and rounds once; its decomposition, traced step by step, rounded every step (float16: 3 of 20
    # OpInfo elements outside tolerance)
    aten.mish_backward.default,
})


@lowers(aten._efficientzerotensor.default)
def _zeros(size: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    from hf_tpu import dtypes

    return _jax().numpy.zeros(tuple(int(s) for s in size), dtypes.to_jax(dtype or torch.get_default_dtype()))


@lowers(aten.linalg_lu.default)
def _linalg_lu(a: Any, *, pivot: bool = True) -> tuple[Any, Any, Any]:
    """P, L, U with A = P @ L @ U from XLA's partial-pivoting LU (LAPACK's getrf on CPU, as torch's), batched and
    rectangular; torchax's slices with a traced size."""
    jax = _jax()
    jnp = jax.numpy
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    m, n = a.shape[-2:]
    k = min(m, n)
    lu, _, perm = jax.lax.linalg.lu(a)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
    upper = jnp.triu(lu[..., :k, :])
    p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=a.dtype), -1, -2)  # A[perm] = L @ U, so P[perm[i], i] = 1
    return p, lower, upper


@lowers(aten._linalg_eigvals.default)
def _linalg_eigvals(a: Any) -> Any:
    """Eigenvalues (complex, LAPACK geev's order as CPU's); torchax lowers only linalg_eig."""
    jnp = _jax().numpy
    return jnp.linalg.eigvals(a).astype(jnp.complex128 if a.dtype in (jnp.float64, jnp.complex128) else jnp.complex64)


@lowers(aten._linalg_solve_ex.default)
def _linalg_solve_ex(a: Any, b: Any, *, left: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any, Any]:
    """(X, LU, pivots, info) as CPU's: the LU factors (of A, or of A^T when solving from the right) are outputs
    that linalg.solve's backward reuses; torchax returned None for them, and info 0 for a singular A."""
    jax = _jax()
    jnp = jax.numpy
    m = a.mT if not left else a
    lu, piv, _ = jax.lax.linalg.lu(m)
    vector = b.ndim == a.ndim - 1  # B a (batch of) vector(s)
    rhs = b[..., None] if vector else b
    if left:
        x = jnp.linalg.solve(a, rhs)
    else:
        x = jnp.swapaxes(jnp.linalg.solve(m, jnp.swapaxes(rhs, -1, -2)), -1, -2)
    return (x[..., 0] if vector else x), lu, (piv + 1).astype(jnp.int32), linalg_lowerings.getrf_info(lu)


@lowers(aten.lu_unpack.default)
def _lu_unpack(lu: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Any, Any, Any]:
    """P, L, U from LAPACK's packed LU and 1-based row swaps (torchax's slices by a traced size)."""
    jax = _jax()
    jnp = jax.numpy
    m, n = lu.shape[-2:]
    k = min(m, n)
    batch = lu.shape[:-2]
    empty = jnp.zeros((0,), lu.dtype)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype) if unpack_data else empty
    upper = jnp.triu(lu[..., :k, :]) if unpack_data else empty
    if not unpack_pivots:
        return empty, lower, upper
    ar = jnp.arange(m)

    def swap(i: Any, perm: Any) -> Any:  # the i-th LAPACK row swap, applied to the row order so far
        b = pivots[..., i].astype(perm.dtype) - 1
        pi, pb = perm[..., i], jnp.take_along_axis(perm, b[..., None], -1)[..., 0]
        return jnp.where(ar == i, pb[..., None], jnp.where(ar == b[..., None], pi[..., None], perm))

    perm = jax.lax.fori_loop(0, min(k, pivots.shape[-1]), swap, jnp.broadcast_to(ar, batch + (m,)))
    return jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu.dtype), -1, -2), lower, upper


lowers(aten.adaptive_max_pool2d.default)(_adaptive_max_pool(2))
lowers(aten.adaptive_max_pool3d.default)(_adaptive_max_pool(3))


def _base(op: Any) -> Callable[..., Any]:
    from hf_tpu.torchax_compat import load_op_table

    lowerings, _ = load_op_table()
    return (lowerings.get(op) or lowerings[op.overloadpacket]).func


def _ieee_div(x: Any, y: Any, dtype: Any) -> Any:
    """x / y in `dtype`, correctly rounded however y broadcasts. XLA's algebraic simplifier rewrites
    a / broadcast(b) into a * broadcast(1 / b) (measured: float32 `x / 3` an ulp off CPU's on 6,665 of 20,000
    elements, x / its row std on 17,394 of 64,000, eager and compiled alike). float32 (and the float32 that a
    half division computes in) is divided in float64 and rounded: even through the rewrite, a * (1 / b) in
    float64 is within 2^-52 of the quotient, and a quotient of two float32 values is never that close to a
    float32 rounding boundary, so the result is the IEEE float32 quotient. float64: the divisor made a full
    array behind an optimisation barrier, which is no broadcast."""
    jax = _jax()
    jnp = jax.numpy
    x, y = jnp.asarray(x, dtype), jnp.asarray(y, dtype)  # the operands in the result's dtype first, as CPU
    if dtype == jnp.float64:
        return x / jax.lax.optimization_barrier(jnp.broadcast_to(y, jnp.broadcast_shapes(x.shape, y.shape)))
    return (x.astype(jnp.float64) / y.astype(jnp.float64)).astype(dtype)


def _divisor_broadcasts(x: Any, y: Any) -> bool:
    shape = getattr(y, "shape", ())
    return tuple(shape) != tuple(getattr(x, "shape", ()))


@lowers(aten.div.Tensor, aten.div.Scalar)
def _div(x: Any, y: Any) -> Any:
    """True division: torchax's, except a float32 or float64 quotient whose divisor broadcasts (a scalar, a
    row statistic), which XLA would otherwise turn into a multiplication by the reciprocal (_ieee_div)."""
    jnp = _jax().numpy
    res = _base(aten.div.Tensor)(x, y)
    if res.dtype in (jnp.float32, jnp.float64) and _divisor_broadcasts(x, y):
        return _ieee_div(x, y, res.dtype)
    return res


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(x: Any, y: Any, *, rounding_mode: str | None = None) -> Any:
    """torch.div with rounding_mode=None is true division (_div); floor and trunc are torchax's."""
    if rounding_mode is None:
        return _div(x, y)
    return _base(aten.div.Tensor_mode)(x, y, rounding_mode=rounding_mode)


@lowers(aten.mean.dim)
def _mean(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """CPU's mean: the sum (float32 for half inputs), then divided by the count, correctly rounded (CPU calls
    sum_out(...).div_(count)); XLA multiplied by 1 / count (a float32 row mean an ulp off on 729 of 1,000
    rows of 64, before summation order is even considered)."""
    jnp = _jax().numpy
    if dtype is not None or x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64):
        return _base(aten.mean.dim)(x, dim, keepdim) if dtype is None else _mean(
            x.astype(_dtype_of(dtype)), dim, keepdim)
    axes = tuple(range(x.ndim)) if not dim else tuple(int(d) % max(x.ndim, 1) for d in dim)
    axes = tuple(a for a in axes if a < x.ndim)
    count = 1
    for a in axes:
        count *= x.shape[a]
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    total = jnp.sum(x.astype(wide), axis=axes, keepdims=keepdim)
    return _ieee_div(total, float(count), wide).astype(x.dtype)


def _dtype_of(dtype: Any) -> Any:
    from hf_tpu import dtypes

    return dtypes.to_jax(dtype) if isinstance(dtype, torch.dtype) else dtype
