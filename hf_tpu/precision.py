"""TPU matmul precision, kept on any XLA platform.

TorchTPU multiplies float32 matrices in bfloat16 by default. `torch.set_float32_matmul_precision`
picks: "medium" (bfloat16 products, float32 sums; the tpu default), "high" (three bfloat16 passes,
about 16 significant bits) or "highest" (float32). XLA:CPU ignores precision hints, so the stand-in
emulates them by rounding the two float32 operands of each matmul-like op before a float32 product:
a bfloat16 x bfloat16 product is exact in float32, so rounding the operands *is* the bfloat16 pass.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

PRECISIONS = ("highest", "high", "medium")
_explicit: str | None = None
_orig_set = torch.set_float32_matmul_precision


def set_matmul_precision(precision: str) -> None:
    """Set the float32 matmul precision for tpu (and, like torch's setter, for other devices: on a CPU with
    AMX-BF16 "medium" makes PyTorch's own CPU matmuls bfloat16 too; references use `cpu_reference()`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"matmul precision must be one of {PRECISIONS}, got {precision!r}")
    global _explicit
    _explicit = precision
    _orig_set(precision)


def _tracking_set(precision: str) -> None:
    # torch's own setter, remembering that the user chose: tpu then follows their choice instead of
    # TorchTPU's "medium" default (torch's global default "highest" cannot be told apart from a choice).
    set_matmul_precision(precision)


def install() -> None:
    torch.set_float32_matmul_precision = _tracking_set


# PyTorch's float32 precision switches (torch.backends.<path>.fp32_precision) that the oracle sets: the CPU
# leaves only. A parent ("" or "mkldnn") set to "ieee", or cuDNN's own switches, make PyTorch's legacy
# `torch.backends.cudnn.allow_tf32` getter raise ("cuDNN conv and cuDNN RNN have different TF32 flags"), and with
# it every `torch.backends.cudnn.flags(...)` block in model code (Transformers' PE Audio: its CPU baseline failed).
# A set leaf wins over its parents; cuDNN and cuBLAS get PyTorch's legacy setters instead (below).
_SWITCHES = ("mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _switch(path: str) -> Any:
    obj: Any = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
    return obj if hasattr(obj, "fp32_precision") else None


@contextlib.contextmanager
def cpu_reference() -> Iterator[None]:
    """PyTorch's float32 matmuls, convolutions and RNNs in IEEE float32 within the block, whatever the user,
    the tpu run or the host set; the caller's settings are restored afterwards.

    The project's oracle: every CPU (or CUDA) reference is computed inside this block. Without it the oracle
    depends on the host: `torch.set_float32_matmul_precision("medium")` (the tpu's default, shared with every
    device) makes oneDNN's CPU matmuls bfloat16 on a CPU with AMX-BF16 and leaves them float32 elsewhere.
    TPU-style rounding is then applied explicitly, by harness/sweep/emulate.py, where a rule asks for it.

    oneDNN is off in the block too: PyTorch's own ATen kernels are the same code on every host, oneDNN's are
    chosen by ISA. Measured on an AMX-BF16 host: a bfloat16 Wav2Vec2 on CPU is 0.20 (rel rmse) from float64
    with oneDNN and 0.013 without it, as with oneDNN capped at AVX2 (0.014).
    """
    legacy = torch.get_float32_matmul_precision()
    mkldnn = torch._C._get_mkldnn_enabled()
    cudnn_tf32 = _cudnn_allow_tf32()
    saved = {path: sw.fp32_precision for path in _SWITCHES if (sw := _switch(path)) is not None}
    # torch's C setter, not torch.set_float32_matmul_precision: hf-tpu's tracking setter would record a
    # user choice for tpu
    torch._C._set_float32_matmul_precision("highest")
    # inside torch.backends' own permission block, as its flags() managers set them: a process that imported
    # torch.testing._internal.common_utils (OpInfo, autocast test lists) has global flag setting disabled
    with _backends_mutable():
        for path in saved:
            _switch(path).fp32_precision = "ieee"
    torch._C._set_mkldnn_enabled(False)  # the C setter: torch.backends.mkldnn.flags() also resets TF32 flags
    if cudnn_tf32 is not None:
        torch._C._set_cudnn_allow_tf32(False)  # the legacy setter: legacy readers of the flag keep working
    try:
        yield
    finally:
        if cudnn_tf32 is not None:
            torch._C._set_cudnn_allow_tf32(cudnn_tf32)
        torch._C._set_mkldnn_enabled(mkldnn)
        torch._C._set_float32_matmul_precision(legacy)
        with _backends_mutable():
            for path, value in saved.items():
                _switch(path).fp32_precision = value


def _cudnn_allow_tf32() -> bool | None:
    """cuDNN's legacy TF32 flag, or None where it cannot be read (the caller mixed the legacy and new APIs):
    then the caller's cuDNN settings are left as they are. cuDNN never runs a CPU reference either way."""
    try:
        return bool(torch._C._get_cudnn_allow_tf32())
    except RuntimeError:
        return None


def _backends_mutable() -> Any:
    return getattr(torch.backends, "__allow_nonbracketed_mutation")()


_forced = threading.local()
_forcing = 0  # forced() blocks open in any thread: while none is, current() skips the thread-local lookup


@contextlib.contextmanager
def forced(value: str) -> Iterator[None]:
    """Use `value` while tracing a compiled program (its precision is part of the program's cache key)."""
    global _forcing
    old = getattr(_forced, "value", None)
    _forced.value = value
    _forcing += 1
    try:
        yield
    finally:
        _forcing -= 1
        _forced.value = old


def current() -> str:
    # runs on every eager op: the thread-local lookup (about a microsecond) only while some forced() is open
    if _forcing:
        f = getattr(_forced, "value", None)
        if f is not None:
            return f
    if _explicit is not None:
        return _explicit
    return _env_default()


@functools.cache
def _env_default() -> str:
    # Read once per process: current() runs on every op.
    return os.environ.get("HF_TPU_MATMUL_PRECISION", "medium")


# ATen ops whose float32 operands are rounded, by operand position.
MATMUL_OPERANDS: dict[str, tuple[int, ...]] = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "matmul": (0, 1),
    "dot": (0, 1),
    "vdot": (0, 1),
    "mv": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "addmv": (1, 2),
    "convolution": (0, 1),
    "_convolution": (0, 1),
    "conv1d": (0, 1),
    "conv2d": (0, 1),
    "conv3d": (0, 1),
    "conv_transpose1d": (0, 1),
    "conv_transpose2d": (0, 1),
    "conv_transpose3d": (0, 1),
    "linear": (0, 1),
    "einsum": (),  # operands come as a list: handled in round_args
    "_scaled_dot_product_flash_attention": (0, 1, 2),
    "_scaled_dot_product_efficient_attention": (0, 1, 2),
    "scaled_dot_product_attention": (0, 1, 2),
}


def round_operand(x: Any, precision: str) -> Any:
    import jax.numpy as jnp

    if getattr(x, "dtype", None) != jnp.float32 or precision == "highest":
        return x
    hi = x.astype(jnp.bfloat16).astype(jnp.float32)
    if precision == "medium":
        return hi
    lo = (x - hi).astype(jnp.bfloat16).astype(jnp.float32)
    return hi + lo


def round_args(op_name: str, args: tuple, precision: str) -> tuple:
    if precision == "highest":
        return args
    positions = MATMUL_OPERANDS.get(op_name)
    if positions is None:
        return args
    args = list(args)
    if op_name == "einsum" and len(args) > 1 and isinstance(args[1], (list, tuple)) and len(args[1]) == 2:
        args[1] = [round_operand(a, precision) for a in args[1]]
    for i in positions:
        if i < len(args):
            args[i] = round_operand(args[i], precision)
    return tuple(args)


# ------------------------------------------------------------------------- 16-bit matmuls, f32 accumulation
# A bfloat16 x bfloat16 matmul whose result is bfloat16 is computed by XLA:CPU as: both operands converted to
# float32, a float32 dot, the result rounded to bfloat16. Asking the dot for a float32 result
# (preferred_element_type) and rounding it after is the same arithmetic (exact products, float32
# accumulation, one rounding), and XLA:CPU then hands the bfloat16 operands to its YNNPACK dot as they are,
# which uses the CPU's bfloat16 dot-product instructions: GPT-2's bfloat16 matmuls take 0.36-0.65x the time,
# with bit-identical results on every shape measured (benchmarks/profile_train.py, the note of issue 31). It
# is also what a TPU's MXU does. The ops whose torchax lowering is a plain `x @ y` (and addmm, `beta * input
# + alpha * (x @ y)`) are computed here when both operands are bfloat16; others keep their lowering.
# HF_TPU_WIDE_BF16_DOTS=0 turns it off (for A/B timing).
WIDE_ACCUMULATION_OPS = (frozenset({"mm", "bmm", "matmul", "addmm"})
                         if os.environ.get("HF_TPU_WIDE_BF16_DOTS", "1") != "0" else frozenset())


def _transposed_from(a: Any) -> Any:
    """The array `a` is the last-two-dims transpose of, when that transpose was traced in this program (a
    `weight.t()` view read inside the op's program, a permute node of a compiled graph); else None. Reads
    JAX's tracing equation of `a` (DynamicJaxprTracer.parent); without one (a concrete array, another JAX)
    the caller keeps the general form, which gives the same values more slowly."""
    eqn = getattr(a, "parent", None)
    if getattr(getattr(eqn, "primitive", None), "name", None) != "transpose":
        return None
    n = a.ndim
    perm = tuple(getattr(eqn, "params", {}).get("permutation", ()))
    ins = getattr(eqn, "in_tracers", ())
    if n < 2 or perm != (*range(n - 2), n - 1, n - 2) or len(ins) != 1:
        return None
    return ins[0]


def _row_major(a: Any) -> Any:
    """`a` laid out row-major in memory (a transpose becomes a real copy instead of a strided read)."""
    from jax.experimental.layout import Layout, with_layout_constraint

    return with_layout_constraint(a, Layout(major_to_minor=tuple(range(a.ndim))))


def _canonical_dot(x: Any, y: Any) -> Any:
    """x @ y (bfloat16, batch dims equal or y 2-D) as a float32-result dot_general in the form XLA:CPU gives to
    YNNPACK's bfloat16 kernel, or None for other shapes.

    XLA:CPU decides whether a bfloat16 dot runs in bfloat16 (YNNPACK) or is widened to float32 (the operand
    upcaster) before it folds transposes into the dot, and only a row-major left operand and a right operand
    that is a row-major parameter or intermediate pass: a transposed operand (every `x @ w.t()` of a linear
    layer, both dots of a linear layer's backward) made the dot a float32 one, 2x slower, or, for a transposed
    left operand, XLA's own float32 dot, 2-2.5x slower (GPT-2's LM head 512x768x50257: 0.33 s vs 0.68 s). So
    a transposed right operand is contracted on its source's last dim (the dimension numbers XLA would fold to
    anyway), and a transposed left operand is made row-major first (a copy of the smaller operand in every
    training dot: the activations or gradients, not the weight). The products and float32 sums are the same;
    the kernel's summation order may differ, as between any two GEMMs."""
    from jax import lax
    import jax.numpy as jnp

    n = x.ndim
    if n < 2 or y.ndim < 2 or (y.ndim != 2 and (y.ndim != n or x.shape[:-2] != y.shape[:-2])):
        return None
    batch = tuple(range(n - 2)) if y.ndim == n else ()
    src = _transposed_from(y)
    rhs, rhs_contract = (src, y.ndim - 1) if src is not None else (y, y.ndim - 2)
    if _transposed_from(x) is not None:
        x = _row_major(x)
    return lax.dot_general(x, rhs, (((n - 1,), (rhs_contract,)), (batch, batch)),
                           preferred_element_type=jnp.float32)


def wide_accumulation_matmul(op_name: str, args: tuple, kwargs: dict) -> Any:
    """The op's result through a float32-accumulating dot, or None when the op or its dtypes are not ones
    this covers (the caller then runs the op's own lowering)."""
    import jax.numpy as jnp

    if op_name == "addmm":
        if len(args) != 3 or set(kwargs) - {"beta", "alpha"}:
            return None
        bias, x, y = args
    elif len(args) == 2 and not kwargs:
        bias, (x, y) = None, args
    else:
        return None
    bf16 = jnp.bfloat16
    if getattr(x, "dtype", None) != bf16 or getattr(y, "dtype", None) != bf16:
        return None
    prod = _canonical_dot(x, y)
    if prod is None:
        prod = jnp.matmul(x, y, preferred_element_type=jnp.float32)
    if bias is None:
        return prod.astype(bf16)
    if getattr(bias, "dtype", None) != bf16:
        return None
    # CPU's addmm: beta * self + alpha * product in float32, rounded once (its gemm's epilogue)
    alpha, beta = kwargs.get("alpha", 1.0), kwargs.get("beta", 1.0)
    out = alpha * prod if beta == 0 else beta * bias.astype(jnp.float32) + alpha * prod
    return out.astype(bf16)
