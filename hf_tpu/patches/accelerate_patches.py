"""Accelerate's device choices, made for `tpu` (each factory's docstring names the upstream behaviour)."""

from __future__ import annotations

import functools
from typing import Any

from hf_tpu.patches.registry import patch, tpu_served_by_hf_tpu


@patch("accelerate.utils.modeling", "get_max_memory", "auto_device_map",
       also_in=("accelerate.utils", "transformers.integrations.accelerate"))
def _max_memory(orig: Any, mod: Any) -> Any:
    """Upstream: accelerate's `get_max_memory()` (behind `device_map="auto"`, "balanced", "sequential")
    counts only CUDA, NPU, MLU, SDAA, MUSA, XPU and HPU devices, so with `tpu` as the accelerator it
    returns {"cpu": ...} and "auto" silently loads the whole model on CPU. Fix: when hf_tpu serves `tpu`
    and the caller gave no `max_memory`, add the tpu devices as integer ids, as accelerate does for CUDA
    (an integer device id is `torch.device(i)`, which is `tpu:i` with `tpu` as the current accelerator).
    accelerate 1.16 counts any `torch.accelerator` device itself: the patch then finds the integer ids
    already there and returns upstream's answer (it matters for older accelerate and explicit budgets)."""

    @functools.wraps(orig)
    def get_max_memory(max_memory: Any = None) -> Any:
        if not tpu_served_by_hf_tpu():
            return orig(max_memory)
        if max_memory is None:
            result = orig(None)
            if any(isinstance(k, int) for k in result):
                return result  # another accelerator answered
            import torch

            return {**{i: _tpu_free_memory(i) for i in range(torch.tpu.device_count())}, **result}
        # An explicit budget (the user's, or the one Transformers computed from ours): upstream would warn
        # "Device 0 is not available" for the tpu ids, so it sees only the host entries.
        ints = {k: v for k, v in max_memory.items() if isinstance(k, int)}
        rest = orig({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        ints = {k: mod.convert_file_size_to_int(v) if isinstance(v, str) else v for k, v in sorted(ints.items())}
        return {**ints, **rest}

    return get_max_memory


def _tpu_free_memory(index: int) -> int:
    """Free bytes on tpu:index: JAX's memory stats where the platform has them, else (XLA:CPU, whose
    device memory is host memory) the host's available memory."""
    import psutil

    from hf_tpu import runtime

    try:
        stats = runtime.jax().devices()[index].memory_stats() or {}
    except Exception:
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return int(psutil.virtual_memory().available)


@patch("accelerate.state", "PartialState.default_device", "accelerate_tpu_device")
def _default_device(prop: Any, mod: Any) -> Any:
    """Upstream: accelerate's `PartialState.default_device` tries MPS, MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU
    and Neuron by name and otherwise returns `cpu`: a PrivateUse1 accelerator is never chosen, so
    `Accelerator().device` was `cpu` with `tpu` present and Accelerate-based training silently ran on CPU.
    Fix: where upstream falls back to CPU and hf_tpu serves `tpu`, the device is `tpu:<current>` (what
    Transformers' TrainingArguments picks through `torch.accelerator`)."""
    import torch

    @functools.wraps(prop.fget)
    def default_device(self: Any) -> Any:
        dev = prop.fget(self)
        if dev.type == "cpu" and tpu_served_by_hf_tpu():
            return torch.device("tpu", torch.tpu.current_device())
        return dev

    return property(default_device)
