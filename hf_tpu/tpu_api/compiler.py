"""torch.tpu.compiler.custom_compiler_options: XLA options for programs compiled inside the block."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_state = threading.local()
_LEVELS = ("O0", "O1", "O2", "O3")


def current_options() -> dict[str, str]:
    """The merged options of the open custom_compiler_options blocks (inner ones win)."""
    return dict(getattr(_state, "options", {}))


@contextlib.contextmanager
def custom_compiler_options(options: dict[str, str]) -> Iterator[None]:
    """XLA compiler options for what is compiled inside the block; nested blocks merge, inner keys winning.

    Special keys as in torch_tpu: "xla_optimization_level" and "xla_memory_fitting_level" (O0-O3), checked
    here. The options are recorded (current_options()); they are TPU compiler flags, which the stand-in's
    XLA:CPU programs do not take, so results and programs are the same with or without them."""
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise TypeError(f"custom_compiler_options takes a dict of option name to value, got {options!r}")
    for key in ("xla_optimization_level", "xla_memory_fitting_level"):
        if key in options and options[key] not in _LEVELS:
            raise ValueError(f"{key} must be one of {_LEVELS}, got {options[key]!r}")
    before = current_options()
    _state.options = {**before, **{k: str(v) for k, v in options.items()}}
    try:
        yield
    finally:
        _state.options = before
