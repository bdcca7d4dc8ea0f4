"""Which torch dtypes `tpu` tensors hold, and their JAX counterparts."""

from __future__ import annotations

import functools
from typing import Any

import torch

# float64 is supported (JAX's x64 mode): the harness's fp64 reference runs on CPU, but user code that
# keeps a float64 buffer (rotary tables, schedulers) must get float64 numbers, not silently float32.
_SUPPORTED = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    # float8 storage and the ops CPU has for it (float8.py: CPU's conversions and float32 compute)
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
)
SUPPORTED_DTYPES = frozenset(_SUPPORTED)


class UnsupportedDtypeError(TypeError):
    pass


class DeclaredUnsupportedDtype(UnsupportedDtypeError, NotImplementedError):
    """A dtype of DECLARED: also a NotImplementedError, as errors.Unsupported, so lowerings that meet it inside
    an op let it through unwrapped."""


# Dtypes declared unsupported (docs/device.md, "Declared unsupported"): the reason and the alternative. The
# message has errors.Unsupported's form ("hf_tpu: X is not supported on tpu: why. instead"), so the OpInfo parity
# run counts these pairs apart.
DECLARED: dict[torch.dtype, tuple[str, str]] = {
    torch.complex32: ("XLA has no complex type of two float16 halves (complex32, torch.chalf); widening to "
                      "complex64 would change the result's dtype",
                      "Use complex64 (x.to(torch.complex64), or compute in float16 and call torch.complex on "
                      "float32 parts)"),
    torch.uint64: ("tpu tensors hold signed 64-bit integers only; PyTorch's CPU has uint64 kernels for a few "
                   "ops (hash_tensor, bit ops, copies) and none for arithmetic",
                   "Use int64 (the same bits: x.view(torch.int64) on CPU), or run the op on CPU"),
}


def check(dtype: torch.dtype) -> torch.dtype:
    if dtype in DECLARED:
        why, instead = DECLARED[dtype]
        raise DeclaredUnsupportedDtype(f"hf_tpu: dtype {dtype} is not supported on tpu: {why}. {instead}")
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _SUPPORTED)
        raise UnsupportedDtypeError(
            f"tpu does not support dtype {dtype}; supported dtypes: {names}. "
            f"Convert on CPU first, e.g. tensor.to(torch.float32) before .to('tpu')."
        )
    return dtype


@functools.cache
def _tables() -> tuple[dict[torch.dtype, Any], dict[Any, torch.dtype]]:
    import jax.numpy as jnp

    t2j = {
        torch.bool: jnp.bool_,
        torch.uint8: jnp.uint8,
        torch.int8: jnp.int8,
        torch.int16: jnp.int16,
        torch.int32: jnp.int32,
        torch.int64: jnp.int64,
        torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16,
        torch.float32: jnp.float32,
        torch.float64: jnp.float64,
        torch.complex64: jnp.complex64,
        torch.complex128: jnp.complex128,
    }
    t2j.update(float8_jax_dtypes())
    j2t = {jnp.dtype(v): k for k, v in t2j.items()}
    return {k: jnp.dtype(v) for k, v in t2j.items()}, j2t


def to_jax(dtype: torch.dtype) -> Any:
    try:
        return _tables()[0][dtype]
    except KeyError:
        check(dtype)
        raise


def to_torch(jax_dtype: Any) -> torch.dtype:
    import jax.numpy as jnp

    try:
        return _tables()[1][jnp.dtype(jax_dtype)]
    except KeyError:
        raise UnsupportedDtypeError(f"tpu got a JAX array of dtype {jax_dtype}, which has no torch dtype") from None


FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu)


@functools.cache
def float8_jax_dtypes() -> dict[torch.dtype, Any]:
    """torch's float8 dtypes -> JAX's (ml_dtypes); hf_tpu/float8.py converts and computes with them."""
    import jax.numpy as jnp

    return {
        torch.float8_e4m3fn: jnp.dtype(jnp.float8_e4m3fn),
        torch.float8_e5m2: jnp.dtype(jnp.float8_e5m2),
        torch.float8_e4m3fnuz: jnp.dtype(jnp.float8_e4m3fnuz),
        torch.float8_e5m2fnuz: jnp.dtype(jnp.float8_e5m2fnuz),
        torch.float8_e8m0fnu: jnp.dtype(jnp.float8_e8m0fnu),
    }
