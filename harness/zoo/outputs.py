"""Flatten any model or pipeline output to named floating tensors, for numerics comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def output_tensors(output: Any) -> dict[str, torch.Tensor]:
    """Named floating-point tensors of `output`: ModelOutput / dict keys and tuple indices joined with dots
    ("logits", "hidden_states.0", "images"), None and non-floating values skipped. Numpy arrays and PIL
    images (pipeline outputs) become tensors; complex tensors are viewed as real pairs."""
    out: dict[str, torch.Tensor] = {}
    _walk(output, "", out, depth=0)
    return out


def _key(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def _walk(value: Any, prefix: str, out: dict[str, torch.Tensor], depth: int) -> None:
    if value is None or depth > 6:
        return
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            value = torch.view_as_real(value)
        if value.is_floating_point():
            out[prefix or "output"] = value
        return
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.floating):
            out[prefix or "output"] = torch.from_numpy(np.ascontiguousarray(value))
        return
    if _is_pil(value):
        out[prefix or "output"] = torch.from_numpy(np.asarray(value, dtype=np.float32).copy())
        return
    if isinstance(value, Mapping) or hasattr(value, "keys") and hasattr(value, "__getitem__"):
        for k in list(value.keys()):
            _walk(value[k], _key(prefix, k), out, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _walk(v, _key(prefix, i), out, depth + 1)
        return
    # Cache objects (past_key_values) and dataclass-like outputs: their tensors, by attribute name.
    for name in ("key_cache", "value_cache"):
        if hasattr(value, name):
            _walk(getattr(value, name), _key(prefix, name), out, depth + 1)
    if hasattr(value, "layers") and isinstance(value.layers, list):
        for i, layer in enumerate(value.layers):
            for name in ("keys", "values"):
                _walk(getattr(layer, name, None), _key(prefix, f"{i}.{name}"), out, depth + 1)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _walk(getattr(value, name, None), _key(prefix, name), out, depth + 1)


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "size") and hasattr(value, "mode")
