"""How many `tpu` devices this process has, and the checks on a device index. Nothing here imports JAX.

A TPU host has several chips, and multi-chip programs (`device_map="auto"`, DDP with `tpu:rank`) need
`tpu:1` to exist before they can be tried. `HF_TPU_NUM_DEVICES=N` (else torch_tpu's own per-host count,
TORCH_TPU_DEVICES_PER_HOST; else torchrun's LOCAL_WORLD_SIZE; default 1) gives `tpu:0..N-1`. Each is one
of N JAX CPU devices, which XLA makes when `--xla_force_host_platform_device_count=N` is in XLA_FLAGS as
its CPU backend starts (add_xla_flag, called by runtime.jax() before that). The device's arrays live on that JAX device, so a
copy between devices is a real transfer, and XLA refuses a program mixing them as a chip would.

With one device (the default) nothing of this costs anything per op: `MULTI` is False and every device
check short-circuits."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

ENV = "HF_TPU_NUM_DEVICES"
TORCH_TPU_ENV = "TORCH_TPU_DEVICES_PER_HOST"  # torch_tpu's variable for a host's devices (its launcher's)
XLA_COUNT_FLAG = "--xla_force_host_platform_device_count"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"  # torchrun's processes on this host


def _read_count() -> tuple[int, str | None]:
    """(N, the variable that set it, or None for the default of 1); a bad value raises naming its variable."""
    for name in (ENV, TORCH_TPU_ENV):
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            n = int(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer: set it to the number of tpu devices this "
                             f"process should have (1 or more), or unset it for one device") from None
        if n < 1:
            raise ValueError(f"{name}={n}: a process needs at least one tpu device; set it to 1 or more, or "
                             "unset it for one device")
        return n, name
    # Under torchrun (or any launcher setting LOCAL_WORLD_SIZE) each rank uses tpu:LOCAL_RANK, as on a CUDA
    # host every rank sees all the host's GPUs: one device per local rank unless a variable above says.
    local = os.environ.get(LOCAL_WORLD_SIZE_ENV, "")
    if local.strip().isdigit() and int(local) > 1:
        return int(local), LOCAL_WORLD_SIZE_ENV
    return 1, None


def _config() -> tuple[int, str | None, str | None]:
    """(count, source, error): a bad value is not raised here, where it would fail `import torch` for every
    program (torch's autoload registers `tpu`), but on the first use of a tpu device (check_config)."""
    try:
        return (*_read_count(), None)
    except ValueError as exc:
        return 1, None, str(exc)


COUNT, SOURCE, ERROR = _config()  # read once: JAX's device count is fixed for the life of the process
MULTI = COUNT > 1


def check_config() -> None:
    """Raise the error of a bad HF_TPU_NUM_DEVICES / TORCH_TPU_DEVICES_PER_HOST, if there is one."""
    if ERROR is not None:
        raise ValueError(ERROR)


def source_text() -> str:
    """What set the count, for error messages."""
    return f"{SOURCE}={COUNT}" if SOURCE else f"{ENV} unset, so 1 device"


def check_index(index: int | None) -> int:
    """`index` when it names one of this process's devices (None: device 0's caller resolves it); else the
    error PyTorch gives for a CUDA ordinal out of range, saying how to get more devices."""
    check_config()
    if index is None:
        return 0
    if not 0 <= index < COUNT:
        last = f"tpu:0..tpu:{COUNT - 1}" if MULTI else "tpu:0"
        raise RuntimeError(
            f"tpu:{index} is not a valid device: this process has {COUNT} tpu device{'s' if MULTI else ''} "
            f"({last}; {source_text()}). Set {ENV} to the number of devices you need before starting Python "
            "(JAX fixes its device count when it starts).")
    return index


def add_xla_flag() -> None:
    """Ask XLA's CPU backend for COUNT devices, if JAX has not started a backend yet (XLA reads its flags
    then). A count the user put in XLA_FLAGS is kept: if it is too small, the first use of a missing device
    says so (jax_devices in tensor.py)."""
    if not MULTI or XLA_COUNT_FLAG in os.environ.get("XLA_FLAGS", ""):
        return
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and bridge.backends_are_initialized():
        return
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_COUNT_FLAG}={COUNT}".strip()


# Call-backs the registration (device.py) sets from the C++ hooks (hf_tpu/native), which sit above the
# tensors that need them: put a data-less tensor on tpu:i with a given data_ptr(), and read this thread's
# current device.
set_tensor_device: Callable[[Any, int, int, Any], None] | None = None
# a tensor's, and a storage's, payload (hf_tpu.tensor.Payload) from the C++ hooks; None without them
get_payload: Callable[[Any], Any] | None = None
get_storage_payload: Callable[[Any], Any] | None = None
current_device: Callable[[], int] = lambda: 0
