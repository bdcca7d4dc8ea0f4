"""Eager view ops on tpu: the result aliases its source's buffer (tensor.py keeps the aliasing), at the
geometry (sizes, strides, offset) PyTorch's meta kernel gives the view, composed with the source's own.
Views that reinterpret the dtype or set the conjugate bit cannot be an index into the same buffer: tpu
gives a copy for those.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import lowering, op_jit
from hf_tpu import tensor as T
from hf_tpu.errors import Unsupported
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _infer_size(size: Any, numel: int) -> list[int]:
    size = [int(s) for s in size]
    if -1 in size:
        i = size.index(-1)
        known = 1
        for j, s in enumerate(size):
            if j != i:
                known *= s
        size[i] = numel // known if known else 0
    n = 1
    for s in size:
        n *= s
    if n != numel:
        raise RuntimeError(f"shape '{size}' is invalid for input of size {numel}")
    return size


@lowers(aten.view.default, aten._unsafe_view.default, kind="eager")
def view(src: torch.Tensor, size: Any) -> torch.Tensor:
    return T.view_reshape(src, _infer_size(size, src.numel()))


@lowers(aten.as_strided.default, kind="eager")
def as_strided(src: torch.Tensor, size: Any, stride: Any, storage_offset: Any = None) -> torch.Tensor:
    return T.make_view(src, [int(s) for s in size], [int(s) for s in stride], int(storage_offset or 0))


@lowers(aten.alias.default, kind="eager")
def alias(src: torch.Tensor) -> torch.Tensor:
    return T.make_view(src, list(src.shape), list(src.stride()), 0)


_view_geometry: dict[Any, Any] = {}


def _geometry(op: Any, src: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    """Where a view op's result lands in src's logical frame, from its meta kernel: (size, stride, offset),
    or a list of them. Cached: a forward takes the same views every call, and a meta call costs more than
    the rest of the view."""
    try:
        key = (op, tuple(src.shape), src.dtype, op_jit.freeze(args), op_jit.freeze(sorted(kwargs.items())))
        hash(key)
    except TypeError:
        key = None
    if key is not None:
        hit = _view_geometry.get(key)
        if hit is not None:
            return hit
    meta = torch.empty(src.shape, dtype=src.dtype, device="meta")
    out = op(meta, *args, **kwargs)

    def geo(o: torch.Tensor) -> tuple:
        return (tuple(o.shape), tuple(o.stride()), o.storage_offset())

    res = [geo(o) for o in out] if isinstance(out, (list, tuple)) else geo(out)
    if key is not None:
        _view_geometry[key] = res
    return res


# (op, source shape, source view, buffer size, arguments) -> (a list of views?, [(size, views.View)]). A
# forward takes the same views every call; composing them again (bounds checks, folding) cost more than the
# rest of the op.
_view_results: dict[Any, tuple[bool, list[tuple[tuple[int, ...], Any]]]] = {}


def generic_view(op: Any, args: tuple, kwargs: dict) -> torch.Tensor | list[torch.Tensor]:
    """Any other view op: its meta kernel says where the view lands in the source's logical frame."""
    src = args[0]
    p = T.payload(src)
    rest = args[1:]
    try:
        hash(rest)
    except TypeError:  # lists (permute's dims, expand's sizes)
        rest = op_jit.freeze(rest)
    key = (op, src.shape, p.view, p.buf.numel, rest, tuple(kwargs.items()) if kwargs else ())
    try:
        hit = _view_results.get(key)
    except TypeError:  # an unhashable argument: compose every time
        key, hit = None, None
    if hit is None:
        g = _geometry(op, src, args[1:], kwargs)
        many = isinstance(g, list)
        hit = many, [(tuple(s), T.compose_view(src, s, st, off)) for s, st, off in (g if many else [g])]
        if key is not None:
            if len(_view_results) > 100_000:  # shapes that keep changing (a growing sequence): start over
                _view_results.clear()
            _view_results[key] = hit
    many, made = hit
    if not many:
        return T.view_of(p.buf, made[0][0], src.dtype, made[0][1], src)
    return [T.view_of(p.buf, size, src.dtype, v, src) for size, v in made]


@lowers(aten.view.dtype, kind="eager")
def view_dtype(src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.view(dtype)`: a bitcast copy (lowering.view_dtype), not an alias."""
    return T.wrap(lowering.view_dtype(T.value(src), dtype), dtype)


@lowers(aten.view_as_real.default, kind="eager")
def view_as_real(src: torch.Tensor) -> torch.Tensor:
    # A view that reinterprets dtype cannot be an index into the same buffer: tpu gives a copy. In-place
    # writes through it do not reach the complex tensor (rare: FFT-based models only read it).
    jnp = T._jnp()
    v = T.value(src)
    return T.wrap(jnp.stack([jnp.real(v), jnp.imag(v)], axis=-1))


@lowers(aten.view_as_complex.default, kind="eager")
def view_as_complex(src: torch.Tensor) -> torch.Tensor:
    if src.dtype == torch.float16:  # silently widening to complex64 would change the result's dtype
        raise Unsupported(aten.view_as_complex.default, "float16 pairs view as complex32 (torch.chalf), a dtype "
                          "XLA does not have", "Convert to float32 first (x.float()) for a complex64 view.")
    v = T.value(src)
    return T.wrap(v[..., 0] + 1j * v[..., 1])


lowers(aten._reshape_alias.default, kind="eager")(lambda src, size, stride: view(src, size))


def _sparse(op: Any) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Unsupported(op, "sparse layouts have no XLA representation (tpu tensors are dense, strided)",
                          "Keep the tensor dense on tpu, or make it sparse on CPU (x.cpu().to_sparse()).")

    return refuse


for _op in (aten._to_sparse.default, aten._to_sparse.sparse_dim, aten._to_sparse_csr.default,
            aten._to_sparse_csc.default, aten._to_sparse_bsr.default, aten._to_sparse_bsc.default):
    lowers(_op, kind="eager")(_sparse(_op))
