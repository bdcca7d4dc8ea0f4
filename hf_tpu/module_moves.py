"""`module.to("tpu")` and `.cpu()` keep every Parameter the same Python object, as moves between CPU and
CUDA do, so tied weights stay tied and optimizers built before the move keep their parameters.

`nn.Module._apply` keeps identity with `param.data = new` only when PyTorch deems the two TensorImpls
shallow-copy compatible, and its list of compatible dense backends does not include PrivateUse1: a move to
or from `tpu` made a new Parameter per module instead (two copies of a tied embedding). PyTorch's own
alternative, `torch.utils.swap_tensors` (the path behind `torch.__future__.set_swap_module_params_on_
conversion`), keeps identity for any pair of devices. It is switched on only for `_apply` calls that move
tensors across `tpu`, detected by applying the conversion to an empty probe tensor, so moves between
other devices behave exactly as before.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

_state = threading.local()


def _crosses_tpu(module: torch.nn.Module, fn: Callable[[torch.Tensor], Any]) -> bool:
    p = next(module.parameters(), None)
    if p is None:
        return False
    try:
        with torch.no_grad():
            out = fn(torch.empty(0, dtype=p.dtype, device=p.device))
    except Exception:  # a conversion that cannot take the probe: leave the call to PyTorch as it is
        return False
    # tpu:0 -> tpu:1 too (several devices, hf_tpu/devices.py): PyTorch would make new Parameters there as well
    return isinstance(out, torch.Tensor) and out.device != p.device and "tpu" in (out.device.type, p.device.type)


def install() -> None:
    """Wrap `nn.Module._apply` once per process."""
    original = torch.nn.Module._apply
    if getattr(original, "_hf_tpu_keeps_identity", False):
        return

    @functools.wraps(original)
    def _apply(self: torch.nn.Module, fn: Callable[[torch.Tensor], Any], recurse: bool = True) -> Any:
        if getattr(_state, "active", False) or torch.__future__.get_swap_module_params_on_conversion() \
                or not _crosses_tpu(self, fn):
            return original(self, fn, recurse)
        _state.active = True
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return original(self, fn, recurse)
        except RuntimeError as exc:
            if "Couldn't swap" not in str(exc):
                raise
            # A parameter something else still references in C++ (an autograd graph) cannot be swapped:
            # finish the move the way PyTorch does without swapping (those parameters become new objects).
            torch.__future__.set_swap_module_params_on_conversion(False)
            return original(self, fn, recurse)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
            _state.active = False

    _apply._hf_tpu_keeps_identity = True  # type: ignore[attr-defined]
    torch.nn.Module._apply = _apply  # type: ignore[method-assign]
