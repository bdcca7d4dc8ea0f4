"""Boolean-mask indexing inside a compiled graph, at the static size the graph records.

`x[mask]` has as many rows as the mask has True elements: eager tpu reads the mask (a concrete array), but in
a traced XLA program the mask is a tracer and JAX refuses it ("Array boolean indices must be concrete").
A graph knows the size anyway where the value's shape is fixed by the program: a boolean-mask setitem
`x[mask] = v` (Kosmos-2's image embeddings) has the backward `grad[mask]` with v's shape recorded on the
node. The mask is then turned into that many integer coordinates with jnp.nonzero(size=...), JAX's own
static-shape form of nonzero (PyTorch's nonzero_static), and indexed as integer indices: the same elements
in the same (row-major) order as CPU's `x[mask]`. Forward setitem needs no rule: torchax lowers index_put
with one boolean mask statically (a where over the mask).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int


def _advanced_size(n: torch.fx.Node) -> int | None:
    """The number of rows the boolean masks of index node `n` select, read off the node's recorded output
    shape; None where the shape is symbolic or the masks' row count cannot be told from it (integer index
    tensors broadcasting with the masks in more than their last dimension)."""
    x, indices = n.args[0], n.args[1]
    out, xval = n.meta.get("val"), x.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(xval, torch.Tensor):
        return None
    # a capture's sizes can be SymInts with a constant value (the mask's count, fixed by the setitem's values)
    if not all(is_concrete_int(d) for d in (*out.shape, *xval.shape)):
        return None
    vals = [None if i is None else i.meta.get("val") for i in indices]
    if any(i is not None and not isinstance(v, torch.Tensor) for i, v in zip(indices, vals, strict=True)):
        return None
    consumed = sum(1 if v is None or v.dtype != torch.bool else v.ndim for v in vals)
    # tensor indices next to one another keep their place in the result; apart, they go first (NumPy's rule)
    slots: list[int] = []
    dim = 0
    for v in vals:
        width = 1 if v is None or v.dtype != torch.bool else v.ndim
        if v is not None:
            slots.append(dim)
        dim += width
    if not slots:
        return None
    tensor_positions = [k for k, v in enumerate(vals) if v is not None]
    adjacent = tensor_positions == list(range(tensor_positions[0], tensor_positions[-1] + 1))
    start = slots[0] if adjacent else 0
    rank = out.ndim - (xval.ndim - consumed)
    if rank < 1:
        return None
    others = [v for v in vals if v is not None and v.dtype != torch.bool]
    if any(v.ndim and v.shape[-1] != 1 for v in others):
        return None  # a mask of 1 row would broadcast as well as one of the last dimension's size: ambiguous
    return int(out.shape[start + rank - 1])


def static_boolean_index(n: torch.fx.Node, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (index.Tensor's lowering) for graph node `n`, taking boolean masks as the integer coordinates of
    their first `size` True elements, `size` the row count the graph recorded; `fn` itself where `n` has no
    boolean index or no static size. A mask with another count at run time than at tracing is the user's
    error that CPU raises in the setitem's forward (shape mismatch); nonzero(size=) pads with index 0 or
    drops the excess instead, as XLA's static shapes require."""
    if n.target not in (torch.ops.aten.index.Tensor, torch.ops.aten._unsafe_index.Tensor) or len(n.args) < 2:
        return fn
    indices = n.args[1]
    if not any(i is not None and isinstance(i.meta.get("val"), torch.Tensor) and i.meta["val"].dtype == torch.bool
               for i in indices):
        return fn
    size = _advanced_size(n)
    if size is None:
        return fn

    def index(x: Any, idx: Any) -> Any:
        import jax.numpy as jnp

        flat: list[Any] = []
        for i in idx:
            if i is not None and i.dtype == jnp.bool_:
                flat.extend(jnp.nonzero(i, size=size, fill_value=0))  # one coordinate array per mask dim
            else:
                flat.append(i)
        return fn(x, flat)

    return index
