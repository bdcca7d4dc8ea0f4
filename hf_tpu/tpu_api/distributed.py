"""torch.tpu.distributed on the stand-in: `spmd_safe` (the names tied to TPU slices and striped
collectives are in the table as hardware-only)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def spmd_safe(func: _F) -> _F:
    """Mark `func` as issuing the same collectives in the same order on every rank.

    Under torch_tpu this lets collectives fuse with the surrounding ops. hf-tpu's `tpu_dist` runs each
    collective as issued, so the function runs unchanged; the mark is kept (`__tpu_spmd_safe__`)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    wrapper.__tpu_spmd_safe__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
