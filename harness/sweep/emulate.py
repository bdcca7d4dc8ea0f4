"""A CPU baseline at the backend's float32 matmul precision, so PyTorch's fp64 RMSE rule stays
precision-aware: at "medium" the `tpu` rounds both float32 operands of every matmul-like op to bfloat16
(then multiplies exactly in float32), at "high" to a pair of bfloat16 values (hf_tpu/precision.py). Within
`matmul_precision(p)`, CPU ops do the same: a TorchDispatchMode rounds the same operands of the same ATen
ops, and SDPA takes its math path (matmuls the mode sees, as on `tpu`, where SDPA decomposes).

The block first pins PyTorch's own precision switches to IEEE float32 (hf_tpu.precision.cpu_reference): on a
CPU with AMX-BF16, `torch.set_float32_matmul_precision("medium")` would otherwise make oneDNN round the
baseline itself, on that host only, and the rounding here would be applied to an already rounded baseline.

The baseline then carries the same kind of error as the backend, so rmse(fp64, tpu) <= 2 * rmse(fp64, cpu)
holds for bfloat16 rounding and fails for an error beyond it, with no fixed floor to guess. Hand-written
because PyTorch's CPU matmuls ignore `set_float32_matmul_precision` (only oneDNN's bf16 path reads it, and
it does not round the same way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_tpu.precision import cpu_reference

# ATen ops (as the dispatcher sees them after composite ops decompose) -> operand positions, as in
# hf_tpu.precision.MATMUL_OPERANDS
OPERANDS: dict[str, tuple[int, ...]] = {
    "mm": (0, 1), "bmm": (0, 1), "matmul": (0, 1), "dot": (0, 1), "vdot": (0, 1), "mv": (0, 1),
    "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "addmv": (1, 2),
    "convolution": (0, 1), "_convolution": (0, 1),
}


def round_operand(x: torch.Tensor, precision: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or precision == "highest":
        return x
    hi = x.to(torch.bfloat16).to(torch.float32)
    if precision == "medium":
        return hi
    return hi + (x - hi).to(torch.bfloat16).to(torch.float32)


class _Rounding(TorchDispatchMode):
    def __init__(self, precision: str) -> None:
        super().__init__()
        self.precision = precision

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        positions = OPERANDS.get(func.__name__.split(".")[0])
        if positions:
            args = list(args)
            for i in positions:
                if i < len(args):
                    args[i] = round_operand(args[i], self.precision)
        return func(*args, **kwargs)


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """CPU float32 matmuls, convolutions and attention at the tpu's `precision` within the block: IEEE float32
    on any host, then the tpu's rounding applied here, explicitly."""
    if precision == "highest":
        with cpu_reference():
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with cpu_reference(), sdpa_kernel(SDPBackend.MATH), _Rounding(precision):
        yield
