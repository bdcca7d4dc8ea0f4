"""max_unpool2d/3d: each input value written at its saved flat index of its (batch, channel) output plane, zeros
elsewhere, as CPU's kernel. torchax's lowering loops over every element in Python and reads each index on the
host (one dispatch per element in eager, and a TracerArrayConversionError inside a compiled graph); this is one
scatter. Indices repeat only where pooling windows overlap, and then they carry the same input value, so the
scatter's order among duplicates does not change the result."""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _unpool(x: Any, indices: Any, output_size: Any, *_: Any) -> Any:
    from hf_tpu import runtime

    jnp = runtime.jax().numpy
    k = len(output_size)
    size = tuple(int(s) for s in output_size)
    lead = x.shape[:-k]
    plane = 1
    for s in size:
        plane *= s
    rows = 1
    for s in lead:
        rows *= int(s)
    vals = x.reshape(rows, -1)
    idx = indices.reshape(rows, -1).astype(jnp.int64)
    out = jnp.zeros((rows, plane), x.dtype)
    out = out.at[jnp.arange(rows)[:, None], idx].set(vals, mode="drop")
    return out.reshape(*lead, *size)


lowers(aten.max_unpool2d.default, aten.max_unpool3d.default)(_unpool)
