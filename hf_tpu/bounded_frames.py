"""Dynamo's automatic dynamic shapes: off for static-shape users, on in frames that asked for bounded dynamism.

hf-tpu's programs have static shapes, so the `tpu` backend turns Dynamo's automatic dynamic shapes off
(`dynamic=None` then behaves as `dynamic=False`): a size or int that changes between calls recompiles
with the new constant instead of becoming a symbol no one asked for. A frame whose inputs carry
`mark_dynamic` bounds asked for dynamism, and there that policy breaks models CPU runs: XLM's length crosses
a graph break (`.item()`) as an int, the resumed frame slices the marked ids by it, and with the int a
constant the slice guards `n <= size`, which breaks the marked minimum at the second length
(ConstraintViolationError). CPU (automatic dynamic on) makes the int symbolic at that recompile.

So a frame is compiled with automatic dynamic shapes when one of its inputs (its locals on entry, which for
a frame resumed after a graph break include the marked tensors still live) has a dimension marked with a
`min` or `max`; every other frame compiles as before. The hook wraps Dynamo's per-frame compile
(torch._dynamo.convert_frame._compile), the one place that sees a frame's inputs before tracing."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

import torch

_state = threading.local()
_installed = False


def bounded_frame() -> bool:
    """Whether a frame with bounded inputs is being compiled on this thread."""
    return getattr(_state, "depth", 0) > 0


def static_shapes_by_default() -> None:
    """Turn automatic dynamic shapes off for everyone but a bounded frame being compiled (whose setting the
    hook restores when its compile ends)."""
    import torch._dynamo.config as dconfig

    install()
    if not bounded_frame():
        dconfig.automatic_dynamic_shapes = False


def _has_bounds(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and any(
        r.min is not None or r.max is not None for r in getattr(t, "_dynamo_dynamic_range", ()) or ())


def has_bounded_inputs(values: Iterable[Any]) -> bool:
    """Whether any tensor among `values` (searched through lists, tuples and dicts) has a bounded mark."""
    from torch.utils import _pytree as pytree

    return any(_has_bounds(leaf) for v in values for leaf in pytree.tree_leaves(v))


def install() -> None:
    """Wrap Dynamo's per-frame compile (once)."""
    global _installed
    if _installed:
        return
    import torch._dynamo.config as dconfig
    from torch._dynamo import convert_frame

    original = convert_frame._compile

    @functools.wraps(original)
    def _compile(code: Any, globals: Any, locals: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        try:
            bounded = has_bounded_inputs(locals.values())
        except Exception:  # noqa: BLE001 - an odd local (a lazy proxy) must not break compiling: static
            bounded = False
        if not bounded:
            return original(code, globals, locals, *args, **kwargs)
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            with dconfig.patch(automatic_dynamic_shapes=True):
                return original(code, globals, locals, *args, **kwargs)
        finally:
            _state.depth -= 1

    convert_frame._compile = _compile
    _installed = True
