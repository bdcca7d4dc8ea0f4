"""Compile caches across processes, in TorchTPU's three tiers (memory, host, shared): a compiled graph
saved once is loaded by later processes, skipping Dynamo and AOTAutograd, and lowered again by today's
backend. XLA executables are cached by JAX's persistent compilation cache (hf_tpu/runtime.py), eager
per-op programs included. docs/compile-cache.md has the design and the invalidation rules.

`install()` (called when hf_tpu registers the device) wraps `torch.compile` so that
`torch.compile(model, backend="tpu")`, as people type it, goes through the cache; anything else is passed
to torch.compile untouched. HF_TPU_COMPILE_CACHE=0 turns the graph cache off.
"""

from __future__ import annotations

import functools
from typing import Any

from hf_tpu.compile_cache import store

_original_compile: Any = None


def _uses_cache(kwargs: dict[str, Any]) -> bool:
    from hf_tpu.compile_cache.cached import enabled

    backend = kwargs.get("backend")
    if not enabled() or kwargs.get("disable") or kwargs.get("dynamic"):
        return False
    if kwargs.get("mode") not in (None, "default"):
        return False
    from hf_tpu import compile_options

    if kwargs.get("options") and not compile_options.cacheable(kwargs["options"]):
        return False  # TorchTPU's options (compile_options.py) keep the cache unless they ask for a fresh compile
    if kwargs.get("shapes_spec") is not None:
        return False
    if isinstance(backend, str):
        return backend == "tpu"
    # a callable backend: only ours, asked of Dynamo's registry (the graph cache sits below the backend)
    from torch._dynamo.backends.registry import lookup_backend

    try:
        return backend is lookup_backend("tpu")
    except Exception:  # noqa: BLE001 - no "tpu" entry point (hf-tpu not installed): not ours
        return False


def install() -> None:
    """Wrap torch.compile (once)."""
    global _original_compile
    import torch

    if _original_compile is not None:
        return
    _original_compile = original = torch.compile

    @functools.wraps(original)
    def compile(model: Any = None, **kwargs: Any) -> Any:  # noqa: A001 - torch.compile's own name
        if model is None:  # used as a decorator factory: @torch.compile(backend="tpu")
            return lambda m: compile(m, **kwargs)
        compiled = original(model, **kwargs)
        if not _uses_cache(kwargs):
            return compiled
        from hf_tpu.compile_cache.cached import wrap

        return wrap(model, compiled)

    compile.__hf_tpu_original__ = original  # type: ignore[attr-defined]
    torch.compile = compile


def stats() -> dict[str, Any]:
    """Hits and misses per tier (memory, host, shared), plus entries saved, unsaveable (ordinary path),
    corrupt (ignored), stale (code changed) and guard misses."""
    return store.stats()


def reset_stats() -> None:
    store.reset_stats()
