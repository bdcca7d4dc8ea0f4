"""aten.histogram.bin_ct and .bins_tensor (torch.histogram), and histogramdd's _histogramdd_bin_edges,
_histogramdd_from_bin_cts and _histogramdd_from_bin_tensors: no lowering in torchax or PyTorch's decompositions.

As CPU's kernel (ATen/native/Histogram.cpp, cpu/HistogramKernel.cpp): the outer edges are `range` or the
input's min and max (widened by 0.5 each way when equal), the bins_ct + 1 edges are torch.linspace's (from both
ends, as its CPU kernel), an element's bin is the last edge at or below it (the rightmost bin keeps its right
edge), elements outside the edges are not counted, weights sum per bin, and density divides by the total
times the bin width.
"""

from __future__ import annotations

import builtins
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _linspace(start: Any, end: Any, steps: int, dtype: Any) -> Any:
    """torch.linspace on CPU: the first half counted from start, the second from end."""
    jnp = _jax().numpy
    start, end = start.astype(dtype), end.astype(dtype)
    if steps == 1:
        return start[None]
    step = (end - start) / jnp.asarray(steps - 1, dtype)
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, start + step * i.astype(dtype), end - step * (steps - i - 1).astype(dtype))


@lowers(aten.histogram.bin_ct)
def _histogram(x: Any, bins: int = 100, *, range: Any = None, weight: Any = None,  # noqa: A002 - ATen's name
               density: bool = False) -> tuple[Any, Any]:
    jnp = _jax().numpy
    flat = x.reshape(-1)
    if range is not None:
        lo, hi = jnp.asarray(range[0], jnp.float64), jnp.asarray(range[1], jnp.float64)
    elif flat.size:
        lo, hi = jnp.min(flat).astype(jnp.float64), jnp.max(flat).astype(jnp.float64)
    else:  # CPU's edges for an empty input: [0, 1]
        lo, hi = jnp.asarray(0.0, jnp.float64), jnp.asarray(1.0, jnp.float64)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return _count(flat, _linspace(lo, hi, bins + 1, x.dtype), weight, density)


@lowers(aten.histogram.bins_tensor)
def _histogram_edges(x: Any, bins: Any, *, weight: Any = None, density: bool = False) -> tuple[Any, Any]:
    """torch.histogram(x, bins=edges): the given (increasing) edges."""
    return _count(x.reshape(-1), bins.astype(x.dtype), weight, density)


def _count(flat: Any, edges: Any, weight: Any, density: bool) -> tuple[Any, Any]:
    jnp = _jax().numpy
    bins = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, flat, side="right") - 1
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    w = jnp.ones_like(flat) if weight is None else weight.reshape(-1).astype(flat.dtype)
    hist = jnp.zeros((bins,), flat.dtype).at[jnp.where(inside, pos, bins)].add(jnp.where(inside, w, 0), mode="drop")
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist, edges


@lowers(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(x: Any, bins: Any, *, range: Any = None, weight: Any = None,  # noqa: A002
                           density: bool = False) -> list[Any]:
    """torch.histogramdd's edges: per dim of the last axis, `range`'s pair or that column's min and max
    (widened by 0.5 each way when equal; [0, 1] for an empty input), bins[d] + 1 edges by linspace."""
    jnp = _jax().numpy
    n = x.shape[-1]
    flat = x.reshape(-1, n)
    if range is not None:
        lo = jnp.asarray([range[2 * d] for d in builtins.range(n)], jnp.float64)
        hi = jnp.asarray([range[2 * d + 1] for d in builtins.range(n)], jnp.float64)
    elif flat.shape[0]:
        lo, hi = jnp.min(flat, axis=0).astype(jnp.float64), jnp.max(flat, axis=0).astype(jnp.float64)
    else:
        lo, hi = jnp.zeros((n,), jnp.float64), jnp.ones((n,), jnp.float64)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return [_linspace(lo[d], hi[d], int(bins[d]) + 1, x.dtype) for d in builtins.range(n)]


def _count_dd(x: Any, edges: list[Any], weight: Any, density: bool) -> Any:
    """CPU's histogramdd kernel: per dim an element's bin is the last edge at or below it (the rightmost bin
    keeps its right edge); an element outside any dim's edges is not counted; density divides by the total,
    then by each dim's bin lengths in turn."""
    jnp = _jax().numpy
    n = len(edges)
    flat = x.reshape(-1, n)
    counts = tuple(e.shape[0] - 1 for e in edges)
    index = jnp.zeros((flat.shape[0],), jnp.int64)
    inside = jnp.ones((flat.shape[0],), bool)
    for d, e in enumerate(edges):
        col = flat[:, d]
        pos = jnp.searchsorted(e, col, side="right") - 1
        pos = jnp.where(pos == counts[d], counts[d] - 1, pos)
        inside = inside & (col >= e[0]) & (col <= e[-1])
        index = index * counts[d] + pos
    total = 1
    for c in counts:
        total *= c
    w = jnp.ones((flat.shape[0],), x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((total,), x.dtype).at[jnp.where(inside, index, total)].add(jnp.where(inside, w, 0),
                                                                              mode="drop")
    hist = hist.reshape(counts)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            shape = [1] * n
            shape[d] = counts[d]
            hist = hist / (e[1:] - e[:-1]).reshape(shape)
    return hist


@lowers(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(x: Any, bins: Any, *, range: Any = None, weight: Any = None,  # noqa: A002
                              density: bool = False) -> Any:
    return _count_dd(x, _histogramdd_bin_edges(x, bins, range=range), weight, density)


@lowers(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(x: Any, bins: Any, *, weight: Any = None, density: bool = False) -> Any:
    return _count_dd(x, [b.astype(x.dtype) for b in bins], weight, density)
