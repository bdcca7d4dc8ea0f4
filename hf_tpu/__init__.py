"""hf-tpu: PyTorch's `tpu` device for Hugging Face models.

With torch_tpu installed and TPU chips attached, torch_tpu serves `tpu`; everywhere else hf_tpu registers
a stand-in whose tensors live in JAX arrays and whose ops run through XLA. `import torch` alone registers
it (see _autoload.py); importing hf_tpu is only needed for the functions below.
"""

from __future__ import annotations

import os as _os
from typing import Any

# torch first: when hf_tpu is imported before torch, torch's backend autoload (at the end of its own
# import) imports hf_tpu.device; with device mid-import here, it would find it half-initialised.
import torch as _torch  # noqa: F401

from hf_tpu import device as _device
from hf_tpu import patches as _patches

__all__ = [
    "backend_info",
    "fallback_ops",
    "reset_fallback_ops",
    "compile_stats",
    "defer_and_fuse",
    "fused_stats",
    "reset_compile_stats",
    "set_matmul_precision",
    "get_matmul_precision",
]

# HF_TPU_DISABLE=1 keeps the stand-in off even when this package is imported (the torch.backends entry
# point imports it too, so checking only in _autoload.py would not be enough).
if _os.environ.get("HF_TPU_DISABLE") != "1" and not _device.real_torch_tpu_present():
    # With `import hf_tpu` before `import torch`, torch's autoload (hf_tpu/_autoload.py) registers the device
    # while this module is still importing: the cache must be installed whichever of the two registered.
    if not _device.is_registered():
        _device.register()
    from hf_tpu import compile_cache as _compile_cache

    _compile_cache.install()  # torch.compile(..., backend="tpu") through the graph cache (compile_cache/)
_patches.install()  # Transformers/Accelerate patches, applied lazily by an import hook (patches/hook.py)


def backend_info() -> dict[str, Any]:
    """Which backend serves `tpu`, and on which JAX platform (starts JAX if it has not started)."""
    import torch

    name = torch._C._get_privateuse1_backend_name()
    if not _device.is_registered():
        return {"backend": "torch_tpu" if name == "tpu" else "none", "platform": "tpu" if name == "tpu" else None,
                "device_name": name}
    from hf_tpu import runtime

    jax = runtime.jax()
    return {
        "backend": "hf_tpu",
        "platform": runtime.platform(),
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
        "matmul_precision": get_matmul_precision(),
        "cache_dir": str(runtime.cache_dir()),
    }


def fallback_ops() -> dict[str, int]:
    from hf_tpu import eager_functional

    return eager_functional.fallback_ops()


def reset_fallback_ops() -> None:
    from hf_tpu import eager_functional

    eager_functional.reset_fallback_ops()


def compile_stats() -> dict[str, int]:
    from hf_tpu import compile as _compile

    return _compile.stats()


def reset_compile_stats() -> None:
    from hf_tpu import compile as _compile

    _compile.reset_stats()


def set_matmul_precision(precision: str) -> None:
    from hf_tpu import precision as _p

    _p.set_matmul_precision(precision)


def get_matmul_precision() -> str:
    from hf_tpu import precision as _p

    return _p.current()


def defer_and_fuse(on: bool = True) -> Any:
    """Context manager: fused eager mode inside the block (TORCH_TPU_DEFER_AND_FUSE=1 for a whole process).
    Ops are recorded and run as one XLA program when a value is needed (hf_tpu/fused.py)."""
    from hf_tpu import fused

    return fused.defer_and_fuse(on)


def fused_stats() -> dict[str, Any]:
    """Fused graphs run, program-cache hits and misses, ops deferred, and what made graphs run."""
    from hf_tpu import fused

    return fused.stats()
