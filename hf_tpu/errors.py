"""The device's errors and how they name an op: the lowest layer, imported by every module that raises or
catches them (lowering, dispatch, fused, decomposed, compile) without importing any of those."""

from __future__ import annotations

from typing import Any


def op_name(op: Any) -> str:
    """`aten::name.overload`, the way PyTorch's errors spell an op."""
    try:
        schema = op._schema
        return f"{schema.name}.{schema.overload_name or 'default'}"
    except AttributeError:
        return str(op)


class NoLowering(NotImplementedError):
    """An ATen op has no JAX lowering; `.op` names it (e.g. aten::_fft_c2c)."""

    def __init__(self, op: Any, detail: str = "") -> None:
        self.op = op_name(op)
        msg = (
            f"hf_tpu: no JAX lowering for {self.op} on tpu{detail}. Set HF_TPU_CPU_FALLBACK=1 to run such "
            "ops on CPU (recorded by hf_tpu.fallback_ops()), or add a lowering to hf_tpu/lowering.py."
        )
        super().__init__(msg)


class TpuOpError(RuntimeError):
    """An op failed inside its JAX lowering; `.op` names it."""

    def __init__(self, op: Any, exc: BaseException) -> None:
        self.op = op_name(op)
        super().__init__(f"{self.op} failed on tpu: {type(exc).__name__}: {exc}")


class Unsupported(NotImplementedError):
    """An op (or an op on a dtype) the device declares it does not support, listed with the reason in
    docs/device.md ("Declared unsupported"); the message names the op, the reason and the alternative."""

    def __init__(self, op: Any, reason: str, alternative: str) -> None:
        self.op = op_name(op)
        super().__init__(f"hf_tpu: {self.op} is not supported on tpu: {reason}. {alternative}")
