"""torch_tpu's "internal" device APIs: on PyTorch >= 2.11/2.13 these torch.tpu functions have
torch.accelerator equivalents and are meant for the framework only. torch_tpu raises when user code calls
them, unless TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1 (then it warns once).

hf-tpu honours the variable, with one difference in the default: unset, calls are allowed silently, because
torch.accelerator's tpu support goes through C++ hooks that are still being completed (issue 25) and
existing hf-tpu code calls these names. "0" gives torch_tpu's default (raise), "1" its warning."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

# name -> (the torch.accelerator replacement, the PyTorch version from which torch_tpu treats it as internal)
LEGACY: dict[str, tuple[str, tuple[int, int]]] = {
    "device": ("torch.accelerator.device_index", (2, 11)),
    "current_device": ("torch.accelerator.current_device_index", (2, 11)),
    "set_device": ("torch.accelerator.set_device_index", (2, 11)),
    "is_available": ("torch.accelerator.is_available", (2, 11)),
    "initial_seed": ("torch.accelerator.random.initial_seed", (2, 13)),
    "get_rng_state": ("torch.accelerator.random.get_rng_state", (2, 13)),
    "set_stream": ("torch.accelerator.set_stream", (2, 11)),
    "synchronize": ("torch.accelerator.synchronize", (2, 11)),
    "device_count": ("torch.accelerator.device_count", (2, 11)),
    "current_stream": ("torch.accelerator.current_stream", (2, 11)),
}
# Callers that reach device modules generically (getattr(torch, device_type)): PyTorch and torch_tpu, as in
# torch_tpu, plus hf-tpu itself and the Hugging Face libraries it serves.
FRAMEWORK = ("torch", "torch_tpu", "hf_tpu", "harness", "transformers", "accelerate", "diffusers", "peft")
_warned: set[str] = set()


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def policy() -> str:
    """"allow" (unset), "warn" (=1) or "raise" (=0)."""
    v = os.environ.get("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS")
    if v is None or v == "":
        return "allow"
    return "warn" if v.lower() in ("1", "true", "yes") else "raise"


def _framework_caller(depth: int) -> bool:
    mod = sys._getframe(depth).f_globals.get("__name__") or ""
    return isinstance(mod, str) and mod.split(".")[0] in FRAMEWORK


def guard(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with torch_tpu's legacy-API check when `name` is one of its internal device APIs."""
    if name not in LEGACY or _torch_version() < LEGACY[name][1]:
        return fn
    prefer = LEGACY[name][0]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        mode = policy()
        if mode != "allow" and not torch.compiler.is_compiling() and not _framework_caller(2):
            message = (f"torch.tpu.{name} is an internal device API on PyTorch {torch.__version__}: use {prefer} "
                       "instead (TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1 allows it with a warning)")
            if mode == "raise":
                raise RuntimeError(message)
            if name not in _warned:
                _warned.add(name)
                warnings.warn(message, FutureWarning, stacklevel=2)
        return fn(*args, **kwargs)

    return checked
