"""logcumsumexp as CPU's kernel computes it: complex input by CPU's own scan, float32 in float64 (CPU's acc_type
for float is double: a float32 scan lost digits past a 1e4 term, and the gradient, a logcumsumexp of the
reversed gradient, was 1e-3 off); other dtypes torchax's lowering. (Half inputs arrive upcast to float32 by
lowering_parity.OPMATH and take the float64 path too.)

CPU (ReduceOpsKernel's logcumsumexp over LogAddExp.h's `_log_add_exp_helper`) runs a sequential scan in the
accumulate type (complex128 for complex64), starting from -inf: each step is max + log1p(exp(min - max)) with
min/max ordered by real part, so a result keeps the imaginary part of its largest term unwrapped (an input of
imaginary part 7.18 gives 7.18, not 7.18 - 2 pi); torchax's log of a cumulative sum of exponentials wrapped it
into (-pi, pi] (logcumsumexp complex64: 64 of 125 elements 2 pi off). Written out because no JAX primitive
has CPU's branch behaviour; jax.lax.scan keeps CPU's order.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _log_add_exp(x: Any, y: Any) -> Any:
    """CPU's complex `_log_add_exp_helper(x, y)` (x the new element, y the running value)."""
    jnp = _jax().numpy
    nan_x, nan_y = jnp.isnan(x), jnp.isnan(y)  # real or imaginary part NaN
    x_first = x.real < y.real
    lo = jnp.where(nan_y, y, jnp.where(nan_x, x, jnp.where(x_first, x, y)))
    hi = jnp.where(nan_y, y, jnp.where(nan_x, x, jnp.where(x_first, y, x)))
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    nan = jnp.array(complex(float("nan"), float("nan")), x.dtype)
    inf_case = jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    return jnp.where(jnp.isnan(lo), nan, jnp.where(both_inf, inf_case, jnp.log1p(jnp.exp(lo - hi)) + hi))


@lowers(aten.logcumsumexp.default)
def logcumsumexp(x: Any, dim: int) -> Any:
    jax = _jax()
    jnp = jax.numpy
    if not jnp.iscomplexobj(x):
        from hf_tpu.torchax_compat import load_op_table

        table = load_op_table()[0]
        base = (table.get(aten.logcumsumexp.default) or table[aten.logcumsumexp]).func
        if x.dtype == jnp.float32:  # CPU's accumulate type (module docstring)
            return base(x.astype(jnp.float64), dim).astype(x.dtype)
        return base(x, dim)
    if x.ndim == 0 or x.size == 0:
        return x
    dim = dim % x.ndim
    acc = jnp.complex128 if x.dtype == jnp.complex64 else x.dtype  # CPU's acc_type for complex<float>
    moved = jnp.moveaxis(x, dim, 0).astype(acc)

    def step(run: Any, v: Any) -> tuple[Any, Any]:
        run = _log_add_exp(v, run)
        return run, run

    start = jnp.full(moved.shape[1:], complex(float("-inf"), 0.0), acc)
    _, out = jax.lax.scan(step, start, moved)
    return jnp.moveaxis(out, 0, dim).astype(x.dtype)
