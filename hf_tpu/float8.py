"""PyTorch's float8 dtypes on tpu: JAX holds them (ml_dtypes' float8 types); this module makes conversions
give CPU's bits and tells dispatch how CPU computes with them.

Conversions: JAX's `astype` and PyTorch's CPU conversion agree on rounding (to nearest even) but not on
what falls outside a type's range (measured on every float32/bfloat16/float16/float64 value class):
  float8_e4m3fn   CPU saturates: anything beyond +-448, infinities included, becomes +-448 (JAX: NaN)
  float8_e5m2     NaN becomes sign | 0x7F, as CPU's kernel writes it (JAX: 0x7E, sign dropped from bfloat16)
  float8_e8m0fnu  CPU takes the magnitude (no sign bit) and maps +-0 to the bits 0 (JAX: NaN for both); the
                  code 0 (2^-127) and float32 subnormals survive conversions on CPU, XLA flushes them
  the fnuz types  a negative value that rounds to zero is 0 on CPU (these types have no -0; JAX gives 0x80,
                  their one NaN); overflow, infinities and NaN agree (0x80)
Non-float sources go through float32 first, as CPU's static_cast does.

Arithmetic: CPU computes every float8 op in float32 and rounds the result to float8 once (c10's Float8
types convert on each operation); XLA would compute in float8 and round with its own overflow rule.
dispatch runs an op with float8 operands on their float32 values (`widen`) and casts its results with
`cast`, so tpu gives CPU's bits.

torch._scaled_mm: CPU's kernel (ATen's, as the oracle runs it with oneDNN off) scales each operand in float32
(a tensor-wise scale, or rowwise: [M, 1] for the first and [1, N] for the second), multiplies in float32, adds
the bias, divides by scale_result for a float8 output and casts once to out_dtype (the first operand's dtype
by default); the lowering below does exactly that, at HIGHEST matmul precision, whatever tpu's precision.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hf_tpu import dtypes
from hf_tpu.op_registry import lowers

DTYPES = dtypes.FLOAT8  # the dtype tables are dtypes.py's (the lowest layer); re-exported for the lowerings


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


jax_dtypes = dtypes.float8_jax_dtypes


@functools.cache
def _names() -> frozenset[str]:
    return frozenset(d.name for d in jax_dtypes().values())


def is_float8(dtype: Any) -> bool:
    """Whether a JAX dtype is one of the float8 types (by name: cheap, and true for tracers' dtypes too)."""
    return getattr(dtype, "name", None) in _names()


def cast(x: Any, want: Any) -> Any:
    """x.astype(want), with CPU's conversion where `want` or x's dtype is a float8 type (module docstring)."""
    jax = _jax()
    jnp = jax.numpy
    want = jnp.dtype(want)
    if x.dtype == want:
        return x
    if x.dtype.name == "float8_e8m0fnu":
        x = _decode_e8m0(x, want)
        if x.dtype == want:
            return x
    if not is_float8(want):
        return x.astype(want)
    if want.name == "float8_e8m0fnu" and x.dtype == jnp.float64:
        return _encode_e8m0_f64(x)
    if x.dtype != jnp.float32:
        x = x.astype(jnp.float32)  # CPU converts through float (c10's float8 constructors take a float)
    name = want.name
    if name == "float8_e4m3fn":
        top = jnp.asarray(448.0, x.dtype)
        return jnp.where(jnp.isnan(x), x, jnp.clip(x, -top, top)).astype(want)
    if name == "float8_e5m2":
        bits = jax.lax.bitcast_convert_type(x.astype(want), jnp.uint8)
        nan = jnp.where(jnp.signbit(x), jnp.uint8(0xFF), jnp.uint8(0x7F))
        return jax.lax.bitcast_convert_type(jnp.where(jnp.isnan(x), nan, bits), want)
    if name == "float8_e8m0fnu":
        return _encode_e8m0(x)
    if name.endswith("fnuz"):
        bits = jax.lax.bitcast_convert_type(x.astype(want), jnp.uint8)
        underflow = (bits == 0x80) & (jnp.abs(x) < 1)
        return jax.lax.bitcast_convert_type(jnp.where(underflow, jnp.uint8(0), bits), want)
    return x.astype(want)


def _encode_e8m0(x: Any) -> Any:
    """float32 -> float8_e8m0fnu from the bits (XLA's conversion flushes float32 subnormals; CPU's does not):
    the magnitude's exponent, rounded up from 1.5 * 2^e (ties up), 2^-127 (the code 0) for zero and anything
    below 1.5 * 2^-127, 0xFF (NaN) for NaN, infinities and overflow."""
    jax = _jax()
    jnp = jax.numpy
    u = jax.lax.bitcast_convert_type(jnp.abs(x), jnp.uint32)
    e, m = u >> 23, u & 0x7FFFFF
    code = jnp.where(e == 0, (m >= 0x600000).astype(jnp.uint32), e + (m >= 0x400000).astype(jnp.uint32))
    code = jnp.where(jnp.isnan(x) | (e == 255), 255, jnp.minimum(code, 255))
    return jax.lax.bitcast_convert_type(code.astype(jnp.uint8), jnp.float8_e8m0fnu)


def _encode_e8m0_f64(x: Any) -> Any:
    """float64 -> float8_e8m0fnu as CPU does (through float32, whose subnormals XLA's float64 -> float32
    conversion would flush): the float64 bits, with a mantissa that rounds to float32's 1.5 rounding up."""
    jax = _jax()
    jnp = jax.numpy
    a = jnp.abs(x)
    u = jax.lax.bitcast_convert_type(a, jnp.uint64)
    e = ((u >> 52) & 0x7FF).astype(jnp.int64)
    m = u & ((1 << 52) - 1)
    up = (m >= (1 << 51) - (1 << 28)).astype(jnp.int64)  # float32 keeps 23 bits, ties to even (1.5 is even)
    code = jnp.where(e - 896 >= 1, e - 896 + up, jnp.where(a >= 1.5 * 2.0 ** -127, 1, 0))
    code = jnp.where(jnp.isnan(x) | (a > 3.4028234663852886e38), 255, jnp.clip(code, 0, 255))
    return jax.lax.bitcast_convert_type(code.astype(jnp.uint8), jnp.float8_e8m0fnu)


def _decode_e8m0(x: Any, want: Any) -> Any:
    """float8_e8m0fnu -> float64 or float32 (then `want`) from the bits: 2^(code - 127), NaN for 0xFF. Code 0
    is 2^-127, a float32 subnormal that XLA's conversion flushes to zero (CPU keeps it)."""
    jax = _jax()
    jnp = jax.numpy
    code = jax.lax.bitcast_convert_type(x, jnp.uint8)
    if want == jnp.bool_:  # no code is zero (and XLA's bool conversion would read 2^-127 as 0)
        return jnp.ones(x.shape, jnp.bool_)
    if want == jnp.float64:
        bits = jnp.where(code == 255, jnp.uint64(0x7FF8000000000000), (code.astype(jnp.uint64) + 896) << 52)
        return jax.lax.bitcast_convert_type(bits, jnp.float64)
    c = code.astype(jnp.uint32)
    bits = jnp.where(code == 255, jnp.uint32(0x7FC00000), jnp.where(code == 0, jnp.uint32(0x00400000), c << 23))
    f = jax.lax.bitcast_convert_type(bits, jnp.float32)
    if want == jnp.bfloat16:  # exact: the top 16 bits
        return jax.lax.bitcast_convert_type((bits >> 16).astype(jnp.uint16), jnp.bfloat16)
    return f


def zeros(shape: tuple[int, ...], dtype: Any) -> Any:
    """Zeros of a JAX dtype; for float8 the all-zero code, as CPU's zeros (float8_e8m0fnu has no zero: its code
    0 is 2^-127, which JAX's conversion of 0.0 would make NaN)."""
    jax = _jax()
    jnp = jax.numpy
    if is_float8(dtype):
        return jax.lax.bitcast_convert_type(jnp.zeros(shape, jnp.uint8), dtype)
    return jnp.zeros(shape, dtype)


def widen(x: Any) -> Any:
    """A float8 array's float32 values (exact); anything else unchanged."""
    if hasattr(x, "dtype") and hasattr(x, "shape") and is_float8(x.dtype):
        return x.astype(_jax().numpy.float32)
    return x


def to_host(t: torch.Tensor) -> Any:
    """A contiguous CPU float8 tensor as a numpy array of ml_dtypes' matching type (torch gives numpy none)."""
    return t.view(torch.uint8).numpy().view(jax_dtypes()[t.dtype])


def from_host(a: Any, dtype: torch.dtype) -> torch.Tensor:
    """A numpy float8 array as a new CPU tensor of `dtype`."""
    import numpy as np

    return torch.from_numpy(np.array(a, copy=True).view(np.uint8)).view(dtype)


_SCALED_MM_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


@lowers(torch.ops.aten._scaled_mm.default)
def scaled_mm(a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any = None, scale_result: Any = None,
              out_dtype: torch.dtype | None = None, use_fast_accum: bool = False) -> Any:
    """torch._scaled_mm on tpu, as CPU computes it (module docstring)."""
    jax = _jax()
    jnp = jax.numpy
    for name, m in (("mat1", a), ("mat2", b)):
        if m.dtype.name not in _SCALED_MM_FLOAT8:
            raise RuntimeError(f"Expected {name} to be Float8 matrix got {m.dtype}; quantize it first, e.g. "
                               "x.to(torch.float8_e4m3fn)")
    if a.ndim != 2 or b.ndim != 2:
        raise RuntimeError(f"_scaled_mm: mat1 and mat2 must be matrices, got {a.ndim}D and {b.ndim}D")
    m, n = a.shape[0], b.shape[1]
    if scale_a.size != 1 and tuple(scale_a.shape) != (m, 1) or scale_b.size != 1 and tuple(scale_b.shape) != (1, n):
        raise RuntimeError(f"_scaled_mm: scales must be tensor-wise (one element) or rowwise ([{m}, 1] for mat1, "
                           f"[1, {n}] for mat2), got {tuple(scale_a.shape)} and {tuple(scale_b.shape)}")
    f32 = jnp.float32
    sa = scale_a.astype(f32).reshape(()) if scale_a.size == 1 else scale_a.astype(f32)
    sb = scale_b.astype(f32).reshape(()) if scale_b.size == 1 else scale_b.astype(f32)
    out = jnp.matmul(a.astype(f32) * sa, b.astype(f32) * sb, precision=jax.lax.Precision.HIGHEST)
    if bias is not None:
        out = out + bias.astype(f32)

    want = dtypes.to_jax(out_dtype) if out_dtype is not None else a.dtype
    if scale_result is not None and is_float8(want):
        out = out * (1 / scale_result.astype(f32).reshape(()))
    return cast(out, want)


@lowers(torch.ops.aten.zeros.default)
def _zeros_factory(size: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:

    return zeros(tuple(int(s) for s in size), dtypes.to_jax(dtype or torch.get_default_dtype()))


@lowers(torch.ops.aten.full.default)
def _full_factory(size: Any, fill_value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
    """torch.full: a float8 fill value converted as CPU converts it (torch.full((2,), 1000., dtype=e4m3fn) is
    448 on CPU, NaN by JAX's conversion); other dtypes by torchax's lowering."""
    if dtype in DTYPES:
        jnp = _jax().numpy

        return cast(jnp.full(tuple(int(s) for s in size), fill_value, jnp.float32), dtypes.to_jax(dtype))
    from hf_tpu.torchax_compat import load_op_table

    table = load_op_table()[0]
    entry = table.get(torch.ops.aten.full.default) or table[torch.ops.aten.full]
    return entry.func(size, fill_value, dtype=dtype)


