"""safetensors' loader, made to accept `device="tpu"`."""

from __future__ import annotations

import functools
from typing import Any

from hf_tpu.patches.registry import is_hf_tpu_device, patch


@patch("safetensors.torch", "load_file", "safetensors_tpu_load_file")
def _load_file(orig: Any, mod: Any) -> Any:
    """Upstream: safetensors' `load_file(path, device="tpu")` fails in its Rust reader ("device tpu is
    invalid"): it knows only the devices it can write to itself. Fix: read on CPU (memory-mapped), then move
    each tensor with `.to(device)`, as a user would."""

    @functools.wraps(orig)
    def load_file(filename: Any, device: Any = "cpu") -> dict[str, Any]:
        import torch

        if is_hf_tpu_device(device):
            return {k: v.to(torch.device(device)) for k, v in orig(filename, device="cpu").items()}
        return orig(filename, device=device)

    return load_file
