"""JAX, started on first use (never on `import torch`): x64, the persistent compilation cache, the platform."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

CACHE_ENV = "HF_TPU_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled XLA programs persist: $HF_TPU_CACHE_DIR, else the per-user cache directory."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hf_tpu" / "xla"


@functools.cache
def jax() -> Any:
    """Import and configure JAX once; every lowering goes through this."""
    import jax as _jax

    # int64 must stay int64 and float64 stay float64, as in PyTorch (JAX would silently use 32 bits).
    _jax.config.update("jax_enable_x64", True)
    if os.environ.get("HF_TPU_DISABLE_DISK_CACHE") != "1":
        path = cache_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
            _jax.config.update("jax_compilation_cache_dir", str(path))
            # Cache every program, the tiny per-op programs of eager mode too: a sweep compiles thousands
            # of them, and loading one skips XLA's LLVM stage, most of its cost.
            min_s = float(os.environ.get("HF_TPU_CACHE_MIN_COMPILE_S", "0"))
            _jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)
            _jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        except OSError:  # an unwritable cache directory costs speed, not correctness
            pass
    return _jax


def platform() -> str:
    """The JAX platform tpu tensors live on (cpu here; gpu or tpu where JAX has them)."""
    return jax().default_backend()
