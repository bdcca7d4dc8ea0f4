"""The error a name tied to TPU hardware raises on a host without chips."""

from __future__ import annotations

from typing import Any, Callable


class TpuHardwareRequired(RuntimeError):
    """Raised by torch.tpu names that need real TPU chips (topology meshes, SparseCore ops, collectives)."""


def needs_hardware(qualname: str) -> Callable[..., Any]:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise TpuHardwareRequired(
            f"{qualname} needs TPU hardware (torch_tpu on a machine with TPU chips); hf-tpu's stand-in serves "
            "the `tpu` device on CPU and cannot emulate it. Guard the call with a check for real chips, or "
            "run it on a TPU VM."
        )

    unavailable.__name__ = qualname.rpartition(".")[2]
    unavailable.__qualname__ = qualname
    unavailable.hardware_only = True  # type: ignore[attr-defined]
    return unavailable
