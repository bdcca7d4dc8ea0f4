"""Eager ops as one XLA call each.

A torchax lowering is often several jnp calls (add with alpha is a multiply and an add, plus dtype
conversions); run eagerly each is a separate dispatch. Wrapping the whole lowering in `jax.jit`, with
tensors as arguments and everything else (dims, shapes, Python scalars, dtypes) static, makes it one
cached program per (op, static arguments, shapes): one dispatch, and the pieces fuse.

Ops that cannot be traced (data-dependent shapes such as nonzero, values read with `.item()`) and random
ops (their key must advance on every call) run eagerly instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.tensor import Operand as _Operand
from hf_tpu.tensor import apply_operand

# HF_TPU_EAGER_JIT=0 runs lowerings primitive by primitive (JAX's own eager mode) instead.
ENABLED = os.environ.get("HF_TPU_EAGER_JIT", "1") != "0"
_untraceable: set[Any] = set()
_programs: dict[Any, Callable[..., Any]] = {}
traces = 0  # op programs traced in this process (a warm executable cache traces none it has seen)


def freeze(x: Any) -> Any:
    """Lists to tuples, recursively: a hashable form of ATen arguments."""
    if isinstance(x, list | tuple):
        return tuple(freeze(v) for v in x)
    return x


def materialise(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Views handed over as geometry (tensor.Operand), read into arrays: for code that is not a program."""
    def one(x: Any) -> Any:
        if type(x) is _Operand:
            return x.materialise()
        if isinstance(x, list | tuple):
            return type(x)(one(v) for v in x)
        return x

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "block_until_ready")


def call(op: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, precision: str, eligible: bool,
         shared: bool = False) -> Any:
    """fn(*args, **kwargs), through a cached jit program when possible."""
    return call_with_program(op, fn, args, kwargs, precision, eligible, shared)[0]


def call_with_program(op: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, precision: str,
                      eligible: bool, shared: bool = False) -> tuple[Any, Callable[..., Any] | None]:
    """(fn(*args, **kwargs), the program that computed it from the array arguments (positional, in order
    of appearance), or None when it ran without one). Callers may call the program again directly for the
    same op and static arguments (dispatch's fast path): jax.jit specialises it to new shapes itself.
    `shared`: the caller vouches that `fn` is the package's own lowering of `op` (no override in force), so
    the op and static arguments name the program in every process: its executables then go through the
    executable cache (executable_cache.py), which skips tracing and lowering in a warm process."""
    if not eligible or op in _untraceable or not ENABLED:
        return _run_plain(fn, args, kwargs), None
    # Split the call into array leaves (traced) and a hashable static skeleton. A view (tensor.Operand)
    # is its buffer (traced) plus its geometry (static): the program reads the view itself.
    arrays: list[Any] = []

    def skeleton(x: Any) -> Any:
        if _is_array(x):
            arrays.append(x)
            return _Slot
        if type(x) is _Operand:
            arrays.append(x.array)
            return (_OperandSlot, x.key)
        if isinstance(x, list | tuple):
            return (type(x), tuple(skeleton(v) for v in x))
        return x

    sk_args = tuple(skeleton(a) for a in args)
    sk_kwargs = tuple(sorted((k, skeleton(v)) for k, v in kwargs.items()))
    # the default dtype too: a factory without a dtype is traced with it; and the lowering itself, so a
    # lowering replaced at run time (a fault injection, a user's override) gets its own program
    key = (op, fn, sk_args, sk_kwargs, precision, torch.get_default_dtype())
    try:
        prog = _programs.get(key)
    except TypeError:  # an unhashable static argument
        return _run_plain(fn, args, kwargs), None
    if prog is None:
        prog = _programs[key] = _build(fn, sk_args, sk_kwargs, _ident(key) if shared else None)
    try:
        return prog(*arrays), prog
    except (*tracer_errors(), Untraceable):
        _untraceable.add(op)
        return _run_plain(fn, args, kwargs), None


class Untraceable(Exception):
    """Raised by a function while being traced when it must not become a cached program (it draws random
    numbers): the op then runs plainly, like one whose trace hit a tracer error."""


def _run_plain(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    args, kwargs = materialise(args, kwargs)
    return fn(*args, **kwargs)


class _Slot:
    """Marks where an array argument goes back in."""


class _OperandSlot:
    """Marks where a view goes back in: (_OperandSlot, key) reads it from its buffer inside the program."""


def _ident(key: tuple) -> str | None:
    """The program's name across processes (executable_cache.Program), or None when a static argument has
    no stable text (an object, an array): then it is cached in this process only."""
    from hf_tpu import executable_cache

    op, _fn, sk_args, sk_kwargs, precision, default_dtype = key

    def text(x: Any) -> str:
        if x is _Slot:
            return "<array>"
        if isinstance(x, tuple) and len(x) == 2 and x[0] is _OperandSlot:
            return f"<view {executable_cache.stable(x[1])}>"
        if isinstance(x, tuple) and len(x) == 2 and x[0] in (list, tuple):
            return f"{x[0].__name__}[" + ",".join(text(v) for v in x[1]) + "]"
        return executable_cache.stable(x)

    try:
        return "op_jit|" + "|".join([executable_cache.stable(op), ",".join(text(a) for a in sk_args),
                                     ",".join(f"{k}={text(v)}" for k, v in sk_kwargs), str(precision),
                                     str(default_dtype)])
    except executable_cache.Unstable:
        return None


def _build(fn: Callable[..., Any], sk_args: tuple, sk_kwargs: tuple, ident: str | None = None) -> Callable[..., Any]:
    from hf_tpu import xla_options

    def fill(x: Any, it: Any) -> Any:
        if x is _Slot:
            return next(it)
        if isinstance(x, tuple) and len(x) == 2:
            if x[0] is _OperandSlot:
                return apply_operand(next(it), x[1])
            if x[0] in (list, tuple):
                return x[0](fill(v, it) for v in x[1])
        return x

    # Positional arrays, not one list: jax.jit's C++ fast path takes positional arrays ~7 us faster per
    # call than a list it must flatten as a pytree (9 vs 16 us for a small add, measured here).
    def program(*arrays: Any) -> Any:
        global traces
        traces += 1  # runs only while JAX traces the program
        it = iter(arrays)
        a = [fill(x, it) for x in sk_args]
        k = {name: fill(v, it) for name, v in sk_kwargs}
        return fn(*a, **k)

    # fast compile, or XLA's defaults from an eager op's size limit (xla_options.py)
    return xla_options.jit(program, ident=ident, large=xla_options.OP_LARGE_ELEMENTS)


@functools.cache
def tracer_errors() -> tuple[type[BaseException], ...]:
    from hf_tpu import runtime

    errors = runtime.jax().errors
    return tuple(
        getattr(errors, n)
        for n in (
            "ConcretizationTypeError",
            "TracerArrayConversionError",
            "TracerBoolConversionError",
            "TracerIntegerConversionError",
            "NonConcreteBooleanIndexError",
            "UnexpectedTracerError",
        )
        if hasattr(errors, n)
    )
