"""TORCH_TPU_ENABLE_DEBUG_CHECKS: TorchTPU's bounds checks on indices computed from data, off by default.

torch_tpu 0.2.0 (its C++ glue's messages) does not check by default that the indices of `take`, indexing and
the other gather/scatter ops are in range, "to prevent an expensive CPU transfer": an index out of range reads
a clamped or NaN value or drops the write, where CPU raises. With TORCH_TPU_ENABLE_DEBUG_CHECKS=1 it checks,
"which incurs a performance penalty". hf-tpu behaves the same: without the variable nothing is checked (and
nothing is added to an op's route), with it every eager op below first copies its index tensors to the host
and raises the error CPU raises for the first index out of range (the same exception type and message).
Compiled graphs are not checked (torch_tpu checks eager ops only).

`set_enabled()` switches the checks for the rest of the process (the eager routes are rebuilt).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

ENV = "TORCH_TPU_ENABLE_DEBUG_CHECKS"


def _from_env() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


_enabled = _from_env()
_listeners: list[Callable[[], None]] = []


def enabled() -> bool:
    return _enabled


def set_enabled(value: bool) -> None:
    """Turns the checks on or off for the process (TORCH_TPU_ENABLE_DEBUG_CHECKS sets the start value)."""
    global _enabled
    _enabled = bool(value)
    for listener in _listeners:
        listener()


def on_change(listener: Callable[[], None]) -> None:
    """`listener` runs whenever the checks are switched (eager dispatch forgets the routes it built)."""
    _listeners.append(listener)


def _host(t: torch.Tensor) -> Any:
    return (t.cpu() if t.device.type != "cpu" else t).reshape(-1)


def _first_outside(idx: torch.Tensor, size: int, negative_ok: bool) -> int | None:
    """The first index (flattened order, as CPU's kernels meet them) outside [-size, size) with negative_ok,
    else outside [0, size); None when all are in range."""
    values = _host(idx)
    low = -size if negative_ok else 0
    bad = ((values < low) | (values >= size)).nonzero()
    return int(values[bad[0, 0]]) if len(bad) else None


def _dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def _size(t: torch.Tensor, dim: int) -> int:
    return int(t.shape[dim]) if t.dim() else 1


def _check_take(a: dict[str, Any]) -> None:
    n = a["self"].numel()
    v = _first_outside(a["index"], n, negative_ok=True)
    if v is not None:
        raise IndexError(f"out of range: tried to access index {v} on a tensor of {n} elements.")


def _check_indices(a: dict[str, Any]) -> None:
    """Advanced indexing (x[i], index_put_): one entry per indexed dimension; None keeps a dimension, a bool
    mask spans as many as it has (its values are not indices). CPU's message numbers the index tensors, not
    the tensor's dimensions (a mask counting as one per dimension it spans): x[:, [6]] on a 2x5 tensor is
    "index 6 is out of bounds for dimension 0 with size 5"."""
    x, d, ordinal = a["self"], 0, 0
    for idx in a["indices"]:
        if idx is None:
            d += 1
            continue
        if idx.dtype in (torch.bool, torch.uint8):
            d += idx.dim()
            ordinal += idx.dim()
            continue
        size = _size(x, d)
        v = _first_outside(idx, size, negative_ok=True)
        if v is not None:
            raise IndexError(f"index {v} is out of bounds for dimension {ordinal} with size {size}")
        d += 1
        ordinal += 1


def _along_dim(message: str, error: type[Exception], negative_ok: bool, self_arg: str = "self",
               index_arg: str = "index", dim: int | None = None) -> Callable[[dict[str, Any]], None]:
    def check(a: dict[str, Any]) -> None:
        x = a[self_arg]
        d = _dim(a["dim"] if dim is None else dim, x.dim())
        size = _size(x, d)
        v = _first_outside(a[index_arg], size, negative_ok)
        if v is not None:
            raise error(message.format(index=v, dim=d, size=size))

    return check


_OUT_OF_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"
# by op name without a trailing underscore: the functional, in-place and out= forms are checked alike.
# Exception types and messages are CPU's (torch 2.13), and so is whether a negative index counts from the end.
CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "take": _check_take,
    "index": _check_indices,
    "index_put": _check_indices,
    "_index_put_impl": _check_indices,
    "index_select": _along_dim("index out of range in self", IndexError, negative_ok=False),
    "index_add": _along_dim("index out of range in self", IndexError, negative_ok=False),
    "embedding": _along_dim("index out of range in self", IndexError, negative_ok=False, self_arg="weight",
                            index_arg="indices", dim=0),
    "index_copy": _along_dim("index_copy_(): " + _OUT_OF_BOUNDS, IndexError, negative_ok=False),
    "index_fill": _along_dim(_OUT_OF_BOUNDS, IndexError, negative_ok=True),
    "gather": _along_dim(_OUT_OF_BOUNDS, RuntimeError, negative_ok=False),
    "scatter": _along_dim(_OUT_OF_BOUNDS, RuntimeError, negative_ok=False),
    "scatter_add": _along_dim(_OUT_OF_BOUNDS, RuntimeError, negative_ok=False),
    "scatter_reduce": _along_dim(_OUT_OF_BOUNDS, RuntimeError, negative_ok=False),
}


_nested = threading.local()


def guarded(check: Callable[[tuple, dict], None], route: Callable[[Any, tuple, dict], Any]) -> Callable[..., Any]:
    """`route` with `check` run first, unless the op runs inside another checked op: the outer op was checked
    with its own rule, and the ops its decomposition issues need not follow theirs (index_fill accepts
    negative indices, the index_copy it decomposes into would not)."""

    def checked(op: Any, args: tuple, kwargs: dict) -> Any:
        if getattr(_nested, "active", False):
            return route(op, args, kwargs)
        check(args, kwargs)
        _nested.active = True
        try:
            return route(op, args, kwargs)
        finally:
            _nested.active = False

    return checked


def check_for(op: Any) -> Callable[[tuple, dict], None] | None:
    """The bounds check to run before `op` (an OpOverload) on its (args, kwargs), or None."""
    schema = getattr(op, "_schema", None)
    check = CHECKS.get(schema.name.split("::")[-1].rstrip("_")) if schema is not None else None
    if check is None:
        return None
    names = [arg.name for arg in schema.arguments]

    def run(args: tuple, kwargs: dict) -> None:
        if torch.compiler.is_compiling():
            return
        bound = dict(zip(names, args))
        bound.update(kwargs)
        check(bound)

    return run
