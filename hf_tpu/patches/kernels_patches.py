"""The Hugging Face `kernels` library (a Transformers dependency from 5.25), made right for hf_tpu's graph
cache (each factory's docstring names the upstream behaviour it fixes)."""

from __future__ import annotations

import functools
from typing import Any

from hf_tpu.patches.registry import patch


@patch("kernels._internals.layer.layer", "_create_func_module", "kernels_func_modules_saveable", optional=True)
def _func_module_names(orig: Any, mod: Any) -> Any:
    """Upstream: `@use_kernel_forward_from_hub` on a function (Transformers' `apply_rotary_pos_emb` and
    others, in every Llama-like model) replaces it with an instance of a class made inside
    `_create_func_module`, so the class's `__qualname__` is `_create_func_module.<locals>.Func`. A compiled
    graph that calls the function guards on that object, and PyTorch's compile package refuses to save
    objects of local classes ("cannot be saved into torch.compile() package since it's defined in local
    scope"): with Transformers 5.25, hf_tpu's graph cache could save no Transformers graph, so every process
    ran Dynamo again. Fix: the class takes the name by which pickle finds it again,
    `<function's module>.<function name>.__class__` (the module-level instance's class), so its
    qualified name resolves in any process that imported the model's module; the instance's own
    `__reduce__` already pickles it by that module-level name. Functions wrapped elsewhere (not at module
    level) keep upstream's local name and stay unsaveable, as before."""

    @functools.wraps(orig)
    def _create_func_module(func: Any) -> Any:
        cls = orig(func)
        name = getattr(func, "__name__", None)
        if name and getattr(func, "__qualname__", None) == name:  # a module-level function
            cls.__module__ = func.__module__
            cls.__qualname__ = cls.__name__ = f"{name}.__class__"
        return cls

    return _create_func_module
