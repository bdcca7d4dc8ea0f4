"""The orthogonal polynomials of torch.special that neither torchax nor PyTorch's decompositions lower:
Chebyshev V and W, the shifted Chebyshev T, U, V and W, and Legendre P.

Each follows CPU's kernel (ATen/native/Math.h) case by case: n < 0 gives 0, the end points have closed forms,
large n inside the interval uses the trigonometric form, and otherwise the three-term recurrence runs n - 1
steps. The recurrence runs to the largest n of the call, each element keeping its value at its own n; n is
truncated to an integer as CPU's static_cast<int64_t>.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _operands(x: Any, n: Any) -> tuple[Any, Any]:
    """x as a float array (integers and bools promoted to the default float dtype, as PyTorch), n as int64."""
    jnp = _jax().numpy
    from hf_tpu import dtypes

    x, n = jnp.asarray(x), jnp.asarray(n)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(dtypes.to_jax(torch.get_default_dtype()))
    x, n = jnp.broadcast_arrays(x, n)
    return x, jnp.trunc(n.astype(jnp.float64) if n.dtype != jnp.int64 else n).astype(jnp.int64)


def _recurrence(x: Any, n: Any, q1: Any, step: Callable[[Any, Any, Any, Any], Any]) -> Any:
    """P_n(x) for n >= 2 from P_0 = 1, P_1 = q1 and P_{k} = step(k, x, P_{k-1}, P_{k-2}), k = 2..n."""
    jax = _jax()
    jnp = jax.numpy
    top = jnp.maximum(jnp.max(n, initial=1), 1)

    def body(k: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        p, q = carry
        r = step(k, x, q, p)
        live = k <= n  # elements whose n is reached keep their value
        return jnp.where(live, q, p), jnp.where(live, r, q)

    _, q = jax.lax.fori_loop(2, top + 1, body, (jnp.ones_like(x), q1))
    return q


def _cases(x: Any, n: Any, cases: list[tuple[Any, Any]], q1: Any, step: Callable[..., Any]) -> Any:
    """The first matching (condition, value) of `cases`, else n == 0 -> 1, n == 1 -> q1, else the recurrence."""
    jnp = _jax().numpy
    out = jnp.where(n == 0, jnp.ones_like(x), jnp.where(n == 1, q1, _recurrence(x, n, q1, step)))
    for cond, value in reversed(cases):
        out = jnp.where(cond, jnp.asarray(value).astype(x.dtype), out)
    return out


def _cheb_step(k: Any, x: Any, q: Any, p: Any) -> Any:
    return (x + x) * q - p


def _chebyshev_v(x: Any, n: Any) -> Any:
    jnp = _jax().numpy
    x, n = _operands(x, n)
    nf = n.astype(x.dtype)
    odd = jnp.where(n % 2 == 0, nf + nf + 1, -(nf + nf + 1))
    a = jnp.arccos(jnp.clip(x, -1, 1))
    trig = jnp.where(jnp.sin(a / 2) != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), odd)
    return _cases(x, n, [(n < 0, 0), (jnp.abs(x) == 1, jnp.where(x > 0, 1, odd)),
                         ((n > 8) & (jnp.abs(x) < 1), trig)], x + x - 1, _cheb_step)


def _chebyshev_w(x: Any, n: Any) -> Any:
    jnp = _jax().numpy
    x, n = _operands(x, n)
    nf = n.astype(x.dtype)
    sign = jnp.where(n % 2 == 0, 1, -1).astype(x.dtype)
    end = jnp.where(x > 0, nf + nf + 1, sign)
    a = jnp.arccos(jnp.clip(x, -1, 1))
    trig = jnp.where(jnp.cos(a / 2) != 1, jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2), end)
    return _cases(x, n, [(n < 0, 0), (jnp.abs(x) == 1, end), ((n > 8) & (jnp.abs(x) < 1), trig)],
                  x + x + 1, _cheb_step)


def _shifted(kind: str) -> Callable[[Any, Any], Any]:
    """Shifted Chebyshev `kind` (t, u, v, w): the polynomial at 2x - 1, with CPU's own end points and cut-offs."""

    def fn(x: Any, n: Any) -> Any:
        jnp = _jax().numpy
        x, n = _operands(x, n)
        nf = n.astype(x.dtype)
        y = x + x - 1
        a = jnp.arccos(jnp.clip(y, -1, 1))
        even = n % 2 == 0
        inside = jnp.abs(y) < 1

        def step(k: Any, x_: Any, q: Any, p: Any) -> Any:
            return (y + y) * q - p

        if kind == "t":
            cases = [(n < 0, 0), (x == 1, 1), (x == 0, jnp.where(even, 1, -1)), ((n > 6) & inside, jnp.cos(nf * a))]
            q1 = y
        elif kind == "u":
            s = jnp.sin(a)
            trig = jnp.where(s != 0, jnp.sin((nf + 1) * a) / s, (nf + 1) * jnp.cos((nf + 1) * a) / y)
            cases = [(n < 0, 0), (x == 1, nf + 1), (x == 0, jnp.where(even, nf + 1, -(nf + 1))),
                     ((n > 6) & inside, trig)]
            q1 = y + y
        elif kind == "v":
            odd = jnp.where(even, nf + nf + 1, -(nf + nf + 1))
            trig = jnp.where(jnp.sin(a / 2) != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), odd)
            cases = [(n < 0, 0), (x == 1, 1), (x == 0, odd), ((n > 6) & inside, trig)]
            q1 = y + y - 1
        else:
            sign = jnp.where(even, 1, -1).astype(x.dtype)
            trig = jnp.where(jnp.cos(a / 2) != 1, jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2), sign)
            cases = [(n < 0, 0), (x == 1, nf + nf + 1), (x == 0, sign), ((n > 4) & inside, trig)]
            q1 = y + y + 1
        return _cases(x, n, cases, q1, step)

    return fn


def _legendre_p(x: Any, n: Any) -> Any:
    jnp = _jax().numpy
    x, n = _operands(x, n)
    end = jnp.where((x > 0) | (n == 1), x, jnp.where(n % 2 == 0, 1, -1).astype(x.dtype))

    def step(k: Any, x_: Any, q: Any, p: Any) -> Any:
        kf = (k - 1).astype(x.dtype)  # CPU's loop variable: P_{k} = ((2(k-1)+1) x P_{k-1} - (k-1) P_{k-2}) / k
        return ((kf + kf + 1) * x * q - kf * p) / (kf + 1)

    return _cases(x, n, [(n < 0, 0), (jnp.abs(x) == 1, end)], x, step)


for _name, _fn in (("chebyshev_polynomial_v", _chebyshev_v), ("chebyshev_polynomial_w", _chebyshev_w),
                   ("shifted_chebyshev_polynomial_t", _shifted("t")),
                   ("shifted_chebyshev_polynomial_u", _shifted("u")),
                   ("shifted_chebyshev_polynomial_v", _shifted("v")),
                   ("shifted_chebyshev_polynomial_w", _shifted("w")), ("legendre_polynomial_p", _legendre_p)):
    _packet = getattr(aten, f"special_{_name}")
    lowers(_packet.default, _packet.x_scalar, _packet.n_scalar)(_fn)
