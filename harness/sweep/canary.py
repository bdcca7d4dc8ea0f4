"""The sweep's own sensitivity check (`hf-tpu sweep --canary`): run each passing row once more with a small
known fault injected into the backend, and record whether the numerics rule flags it.

The fault is a lowering replacement: while `inject(fault)` is active, `hf_tpu.lowering.find` returns, for
the ops of the fault's family, the original lowering with its result scaled by `1 + eps`. Both modes see
it: eager dispatch and the compiler look lowerings up through `lowering.find`, dispatch's fast path uses a
plan only while `find` still returns the plan's lowering, and op_jit keys its programs by the lowering. The
CPU baseline and the float64 reference never go through lowerings, so only the backend is wrong.

Families (`FAMILIES`): `matmul` = the ops that lower to `dot_general` (mm, bmm, addmm, linear, einsum, ...;
SDPA decomposes into these), `conv` = the convolutions; `all` = both. A fault is written `FAMILY[:FACTOR]`,
default `matmul:1.01` (every matmul result 1% too large).

A canary outcome per row (column `canary`):
    caught     the rule fails the faulty run (what a trustworthy rule does)
    missed     the faulty outputs differ from the clean ones, yet the rule passes them
    untouched  the faulty outputs are bit-identical to the clean ones: no op of the family on the output's
               path (or a saturated output), so no rule could see the fault
Sensitivity = caught / (caught + missed) over the rows that passed clean.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

DOT_OPS = frozenset({"mm", "bmm", "matmul", "dot", "vdot", "mv", "addmm", "baddbmm", "addbmm", "addmv", "linear",
                     "einsum", "tensordot", "_scaled_mm"})
CONV_OPS = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                      "conv_transpose2d", "conv_transpose3d"})
FAMILIES: dict[str, frozenset[str]] = {"matmul": DOT_OPS, "conv": CONV_OPS, "all": DOT_OPS | CONV_OPS}
DEFAULT_FAULT = "matmul:1.01"
OUTCOMES = ("caught", "missed", "untouched")


@dataclass(frozen=True)
class Fault:
    family: str
    factor: float

    @property
    def ops(self) -> frozenset[str]:
        return FAMILIES[self.family]

    def __str__(self) -> str:
        return f"{self.family}:{self.factor:g}"


def parse_fault(spec: str | None) -> Fault:
    """`FAMILY[:FACTOR]` -> Fault. Raises ValueError naming the problem and the accepted forms."""
    spec = (spec or DEFAULT_FAULT).strip()
    family, _, factor = spec.partition(":")
    if family not in FAMILIES:
        raise ValueError(f"bad canary fault {spec!r}: family must be one of {', '.join(FAMILIES)} "
                         f"(e.g. {DEFAULT_FAULT})")
    try:
        value = float(factor) if factor else 1.01
    except ValueError:
        raise ValueError(f"bad canary fault {spec!r}: the factor after ':' must be a number (e.g. {DEFAULT_FAULT})") from None
    if value == 1.0 or value != value:
        raise ValueError(f"bad canary fault {spec!r}: a factor of {value} injects no fault")
    return Fault(family, value)


def _op_base_name(op: Any) -> str:
    name = getattr(op, "__name__", "") or ""
    return name.split(".")[0]


def _scaled(fn: Callable[..., Any], factor: float) -> Callable[..., Any]:
    def faulty(*args: Any, **kwargs: Any) -> Any:
        return _scale(fn(*args, **kwargs), factor)

    faulty.__wrapped__ = fn  # type: ignore[attr-defined]
    return faulty


def _scale(res: Any, factor: float) -> Any:
    if isinstance(res, (list, tuple)):
        return type(res)(_scale(r, factor) for r in res)
    dtype = str(getattr(res, "dtype", ""))
    if "float" not in dtype and "complex" not in dtype:
        return res
    return res * factor  # a Python float is weakly typed in JAX: the result keeps the array's dtype


@contextlib.contextmanager
def inject(fault: Fault | str) -> Iterator[Fault]:
    """Within the block, lowerings of the fault's ops return results scaled by its factor (backend only)."""
    from hf_tpu import hooks

    if isinstance(fault, str):
        fault = parse_fault(fault)

    def replace(op: Any, fn: Callable[..., Any]) -> Callable[..., Any] | None:
        # asked once per op: the scaled lowering is one object, so plans and programs made from it stay valid
        return _scaled(fn, fault.factor) if _op_base_name(op) in fault.ops else None

    with hooks.override_lowerings(replace):
        yield fault


def outcome(faulty_match: bool, faulty: dict, clean: dict) -> str:
    """caught | missed | untouched, from the rule's verdict on the faulty run and the two runs' outputs."""
    if not faulty_match:
        return "caught"
    import torch

    same = set(faulty) == set(clean) and all(
        faulty[k].shape == clean[k].shape and torch.equal(faulty[k].nan_to_num(0.0), clean[k].nan_to_num(0.0))
        for k in clean)
    return "untouched" if same else "missed"
