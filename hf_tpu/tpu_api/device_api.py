"""torch.tpu's device functions on the stand-in: tpu:0..N-1 (hf_tpu/devices.py: HF_TPU_NUM_DEVICES), the
current device kept per thread by the C++ hooks (as CUDA's), random state in hf_tpu.rng."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

NAME = "tpu"


def _jax_started() -> bool:
    return "jax" in sys.modules


def _index(device: Any, optional: bool = True) -> int:
    """The device index `device` names (the current device for None, "tpu" or a negative int), checked
    against this process's devices."""
    from hf_tpu import devices

    if device is None or (isinstance(device, int) and device < 0):
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != NAME:
            raise ValueError(f"expected a tpu device, got {device}")
        return current_device() if device.index is None else devices.check_index(device.index)
    if isinstance(device, int):
        return devices.check_index(device)
    raise TypeError(f"expected an int, str or torch.device naming a tpu device, got {type(device).__name__}")


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    from hf_tpu import devices

    devices.check_config()
    return devices.COUNT


def current_device() -> int:
    from hf_tpu import devices

    return devices.current_device()


def set_device(device: Any) -> None:
    """Make `device` this thread's current tpu device (where device="tpu" tensors are made), as
    torch.cuda.set_device; through PyTorch's accelerator API, so its device guards see the same device."""
    if device is None or (isinstance(device, int) and device < 0):
        return  # PyTorch's set_device ignores a negative index
    torch.accelerator.set_device_index(_index(device))


@contextlib.contextmanager
def device(device: Any) -> Iterator[None]:
    """Make `device` current inside the block and restore the previous one after (torch_tpu's and
    torch.cuda's `device`); None leaves the current device as it is."""
    if device is None or (isinstance(device, int) and device < 0):
        yield
        return
    before = current_device()
    set_device(device)
    try:
        yield
    finally:
        set_device(before)


def device_of(obj: Any) -> contextlib.AbstractContextManager[None]:
    """Select the device of tensor `obj`; a no-op when `obj` is not on tpu (as torch.cuda.device_of)."""
    dev = getattr(obj, "device", None)
    return device(dev if getattr(dev, "type", None) == NAME else None)


def synchronize(device: Any = None) -> None:
    """Wait for all queued tpu work (JAX dispatches asynchronously; every device's, which includes
    `device`'s)."""
    _index(device)
    if _jax_started():
        from hf_tpu import runtime

        for a in runtime.jax().live_arrays():
            a.block_until_ready()


def manual_seed(seed: int) -> None:
    from hf_tpu import rng

    rng.seed(seed)


manual_seed_all = manual_seed


def seed() -> None:
    from hf_tpu import rng

    rng.seed(torch.seed())


def initial_seed() -> int:
    from hf_tpu import rng

    return rng.initial_seed()


# torch.compile'd code that saves and restores the tpu generator (torch.random.fork_rng; PyTorch's OpInfo
# wrapper_set_seed around `x.item()`) runs these two eagerly: Dynamo cannot trace the NumPy view of the JAX key
# ("Expected np.nditer base, got memoryview"). torch._disable_dynamo imports Dynamo only when called.
@torch._disable_dynamo
def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    """The tpu generator's state as a uint8 CPU tensor (the JAX key's bytes)."""
    from hf_tpu import rng

    _index(device)
    return rng.state_bytes()


@torch._disable_dynamo
def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    """Restore a state from get_rng_state: the next draws repeat the ones that followed it."""
    from hf_tpu import rng

    _index(device)
    rng.set_state_bytes(new_state)


class TpuGenerator:
    """The default tpu generator as `torch.tpu.default_generators[0]`: seeds and states go to hf_tpu.rng.

    A Python object, not a torch.Generator: PyTorch builds a PrivateUse1 torch.Generator only through the
    C++ hooks (issue 25), and hf-tpu's random ops draw from a JAX key, not from a Philox state."""

    device = torch.device(NAME, 0)

    def manual_seed(self, seed: int) -> TpuGenerator:
        manual_seed(seed)
        return self

    def seed(self) -> int:
        s = torch.seed()
        manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return initial_seed()

    def get_state(self) -> torch.Tensor:
        return get_rng_state()

    def set_state(self, state: torch.Tensor) -> TpuGenerator:
        set_rng_state(state)
        return self


_generators = (TpuGenerator(),)
default_generators = (lambda: _generators, None)  # a read-only module property (table.P)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def empty_cache() -> None:
    pass


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tpu tensors (hf_tpu/memory.py), as torch.accelerator.memory_allocated()."""
    from hf_tpu import memory

    return memory.allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """The most bytes live tpu tensors held at once since start or the last reset_peak_memory_stats()."""
    from hf_tpu import memory

    return memory.max_allocated(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    from hf_tpu import memory

    memory.reset_peak(_index(device))


def get_device_name(device: Any = None) -> str:
    from hf_tpu import runtime

    return f"tpu (hf_tpu on JAX {runtime.platform()})"


@dataclasses.dataclass(frozen=True)
class _TpuDeviceProperties:
    """Like torch_tpu's: name, total_memory (bytes), multi_processor_count."""

    name: str
    total_memory: int
    multi_processor_count: int = 1


def host_memory_bytes() -> int:
    """The host's physical memory: the stand-in's tpu arrays live there."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def get_device_properties(device: Any = None) -> _TpuDeviceProperties:
    _index(device)
    return _TpuDeviceProperties(name=get_device_name(device), total_memory=host_memory_bytes())
