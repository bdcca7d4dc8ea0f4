"""torch.tpu's precision and eager-mode switches, mapped onto hf-tpu's own.

Precision: StableHLO's DEFAULT / HIGH / HIGHEST are what PyTorch calls "medium" (one bfloat16 pass),
"high" (three passes) and "highest" (float32); hf_tpu.precision emulates each on any XLA platform.
Eager modes: DEFER_NEVER is hf-tpu's Strict eager (each op dispatched as issued, asynchronously),
DEFER_NEVER_AND_LAUNCH_BLOCKING adds launch blocking (each op completes before the next; errors raise at
the op), DEFER_AND_FUSE is fused eager mode (hf_tpu/fused.py)."""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator

import torch

from hf_tpu import fused, precision as _precision


class Precision(enum.Enum):
    """StableHLO dot precision (torch_tpu's `torch.tpu.Precision`); the value is PyTorch's name for it."""

    DEFAULT = "medium"
    HIGH = "high"
    HIGHEST = "highest"


@contextlib.contextmanager
def precision(mode: Precision) -> Iterator[None]:
    """Matmul precision inside the block (overrides torch.set_float32_matmul_precision there; restored on
    exit). `torch.get_float32_matmul_precision()` reports the block's precision while it is open."""
    if not isinstance(mode, Precision):
        raise ValueError(f"expected one of Precision.DEFAULT, Precision.HIGH or Precision.HIGHEST, got {mode!r}")
    # torch.compile cannot trace a switch of global state: the frame runs eagerly, as under torch_tpu.
    torch._dynamo.graph_break(msg="torch.tpu.precision is not traceable: the frame falls back to eager")
    before = torch.get_float32_matmul_precision()
    torch._C._set_float32_matmul_precision(mode.value)
    try:
        with _precision.forced(mode.value):
            yield
    finally:
        torch._C._set_float32_matmul_precision(before)


class EagerMode(enum.Enum):
    """How eager tpu ops run (torch_tpu's `torch.tpu.EagerMode`)."""

    DEFER_AND_FUSE = "defer_and_fuse"
    DEFER_NEVER = "defer_never"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "defer_never_and_launch_blocking"


def _get_eager_mode() -> EagerMode:
    if fused.LAUNCH_BLOCKING:
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    return EagerMode.DEFER_AND_FUSE if fused.active() else EagerMode.DEFER_NEVER


def _set_eager_mode(mode: EagerMode) -> None:
    if not isinstance(mode, EagerMode):
        raise TypeError(f"eager mode must be a torch.tpu.EagerMode, got {mode!r}")
    if torch.compiler.is_compiling():
        raise RuntimeError("A compiled graph cannot select how to dispatch eager ops: set the eager mode "
                           "outside torch.compile")
    fused.set_launch_blocking(mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)
    fused.set_active(mode is EagerMode.DEFER_AND_FUSE)


eager_mode = (_get_eager_mode, _set_eager_mode)  # module property: `torch.tpu.eager_mode = EagerMode.X`


@contextlib.contextmanager
def set_eager_mode(mode: EagerMode) -> Iterator[None]:
    """Eager mode inside the block; the previous mode is restored on exit (pending fused work runs then)."""
    before = _get_eager_mode()
    _set_eager_mode(mode)
    try:
        yield
    finally:
        _set_eager_mode(before)


def _xla_flag_default() -> bool:
    flags = os.environ.get("XLA_FLAGS", "")
    for f in flags.split():
        if f.startswith("--xla_allow_excess_precision"):
            return f.partition("=")[2].lower() not in ("false", "0")
    return False


_allow_excess: bool | None = None


def _get_allow_excess() -> bool:
    return _xla_flag_default() if _allow_excess is None else _allow_excess


def _set_allow_excess(value: bool) -> None:
    """Whether XLA may keep intermediates in higher precision than their dtype. Recorded and reported only:
    XLA:CPU reads its flags when the backend starts, so the stand-in's programs do not change with it."""
    global _allow_excess
    if not isinstance(value, bool):
        raise TypeError(f"allow_excess_precision takes True or False, got {value!r}")
    _allow_excess = value


allow_excess_precision = (_get_allow_excess, _set_allow_excess)
