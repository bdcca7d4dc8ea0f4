"""The in-place random fills `exponential_`, `log_normal_`, `cauchy_`, `geometric_` and `random_` on tpu, with
CPU's argument checks and value ranges, drawing from the `generator=` they are given.

torchax's `exponential_` and `cauchy_` use the constant key PRNGKey(0) (every call drew the same numbers),
it has no `random_`, and PyTorch's reference decompositions of the rest refuse a generator ("generator is not
supported in refs"). Each rule here is the functional op PyTorch's functionalisation turns the fill into,
and takes its JAX key from rng.ENV: from the tpu generator passed (its (seed, offset) pair: reseeding or
restoring its state repeats the draws) or from the default one. They are flagged `random`, so that eager
dispatch never caches a program with a key baked in and compiled graphs take a fresh key on every call.

`random_` follows ATen's integer transform (DistributionTemplates.h, TransformationHelper.h): a 32-bit
draw, or a 64-bit one when the range needs it, taken modulo the range plus the base; without bounds the
range is [0, 2**mantissa_digits] for floating dtypes, [0, max] for integer ones, {0, 1} for bool.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import dtypes
from hf_tpu.op_registry import lowers, mark
from hf_tpu.rng import ENV

aten = torch.ops.aten

RANDOM = mark("random", {aten.exponential.default, aten.log_normal.default, aten.cauchy.default,
                         aten.geometric.default, aten.random.default, aten.random.to, getattr(aten.random, "from")})


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _torch_dtype(x: Any) -> torch.dtype:
    return dtypes.to_torch(x.dtype)


def _float_draw_dtype(x: Any) -> Any:
    """Samples are drawn in float64 for float64 tensors and float32 otherwise (then rounded once), as CPU
    computes half-precision fills in float and rounds."""
    jnp = _jax().numpy
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _needs_float(name: str, x: Any) -> None:
    if not _torch_dtype(x).is_floating_point:
        raise RuntimeError(f"{name}_ not implemented for '{_torch_dtype(x)}' (a floating dtype is needed, as on CPU)")


@lowers(aten.exponential.default)
def _exponential(x: Any, lambd: float = 1.0, *, generator: torch.Generator | None = None) -> Any:
    if not lambd > 0.0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    _needs_float("exponential", x)
    jax = _jax()
    draw = jax.random.exponential(ENV.get_and_rotate_prng_key(generator), x.shape, _float_draw_dtype(x))
    return (draw / lambd).astype(x.dtype)


@lowers(aten.log_normal.default)
def _log_normal(x: Any, mean: float = 1.0, std: float = 2.0, *, generator: torch.Generator | None = None) -> Any:
    if not std > 0.0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    _needs_float("log_normal", x)
    jax = _jax()
    draw = jax.random.normal(ENV.get_and_rotate_prng_key(generator), x.shape, _float_draw_dtype(x))
    return jax.numpy.exp(draw * std + mean).astype(x.dtype)


@lowers(aten.cauchy.default)
def _cauchy(x: Any, median: float = 0.0, sigma: float = 1.0, *, generator: torch.Generator | None = None) -> Any:
    if not sigma > 0.0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    _needs_float("cauchy", x)
    jax = _jax()
    draw = jax.random.cauchy(ENV.get_and_rotate_prng_key(generator), x.shape, _float_draw_dtype(x))
    return (draw * sigma + median).astype(x.dtype)


@lowers(aten.geometric.default)
def _geometric(x: Any, p: float, *, generator: torch.Generator | None = None) -> Any:
    """Trials up to and including the first success (support 1, 2, ...), in the tensor's dtype: torchax's
    returned int64 whatever the tensor held."""
    if not 0.0 < p < 1.0:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    jax = _jax()
    draw = jax.random.geometric(ENV.get_and_rotate_prng_key(generator), p, x.shape, jax.numpy.int64)
    return draw.astype(x.dtype)


def _upper_inclusive(dtype: torch.dtype) -> int:
    """The largest value `random_` draws without a bound: 2**digits for floating dtypes (every integer up to
    it is exact), the type's max for integer ones."""
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return 2 ** {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}.get(dtype, 24)
    return int(torch.iinfo(dtype).max)


def _from_range(x: Any, base: int, span: int, generator: torch.Generator | None) -> Any:
    """ATen's uniform_int_from_to: (V % span) + base, V a 32-bit draw, or 64-bit when span >= 2**32."""
    jax = _jax()
    jnp = jax.numpy
    wide = span >= 1 << 32
    bits = jax.random.bits(ENV.get_and_rotate_prng_key(generator), x.shape, jnp.uint64 if wide else jnp.uint32)
    # span is at most 2**64 (the full int64 range): a uint64 modulus of 0 would mean "no reduction"
    r = bits if span == 1 << 64 else bits % jnp.asarray(span, bits.dtype)
    if x.dtype == jnp.bool_:
        return (r + base).astype(jnp.bool_)
    # added in int64 (wraps exactly as ATen's int64 arithmetic does for the full range), then cast
    return (r.astype(jnp.int64) + jnp.int64(base)).astype(x.dtype)


def _check_bounds(dtype: torch.dtype, frm: int, to_inc: int) -> None:
    if dtype.is_floating_point:
        limit = _upper_inclusive(dtype)
        for name, v in (("from", frm), ("to - 1", to_inc)):
            if not -limit <= v <= limit:
                raise RuntimeError(f"random_ expects '{name}' to be in [-2^digits, 2^digits] = [{-limit}, {limit}] "
                                   f"for {dtype}, but got {v}")
    elif dtype != torch.bool:
        info = torch.iinfo(dtype)
        for name, v in (("from", frm), ("to - 1", to_inc)):
            if not info.min <= v <= info.max:
                raise RuntimeError(f"random_ expects '{name}' to be in [{info.min}, {info.max}] for {dtype}, "
                                   f"but got {v}")


@lowers(getattr(aten.random, "from"))  # `from` is a Python keyword
def _random_from(x: Any, *args: Any, generator: torch.Generator | None = None, **kwargs: Any) -> Any:
    bound = dict(zip(("from", "to"), args), **kwargs)
    dtype = _torch_dtype(x)
    frm, to = int(bound["from"]), bound.get("to")
    if to is not None:
        if not frm < int(to):
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={frm} >= to={int(to)}")
        to_inc = int(to) - 1
    else:
        to_inc = _upper_inclusive(dtype)
        if not frm <= to_inc:
            raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                               f"casted to dtype, but got from={frm} > to_inc={to_inc}")
    _check_bounds(dtype, frm, to_inc)
    return _from_range(x, frm, to_inc - frm + 1, generator)


@lowers(aten.random.to)
def _random_to(x: Any, to: int, *, generator: torch.Generator | None = None) -> Any:
    return _random_from(x, 0, to, generator=generator)


@lowers(aten.random.default)
def _random(x: Any, *, generator: torch.Generator | None = None) -> Any:
    """[0, 2**digits] for floating dtypes, [0, max] for integer ones (ATen's uniform_int), {0, 1} for bool."""
    upper = _upper_inclusive(_torch_dtype(x))
    return _from_range(x, 0, upper + 1, generator)

