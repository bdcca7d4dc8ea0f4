"""Bounded dynamism's rules for tensors of positions (bounded_plan.py asks them first for every op): a sort
along a dynamic dimension, and the positions it yields, as MoE dispatch uses them."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from hf_tpu.bounded_sizes import Factors, Unsupported, dyn_dims, expr, is_dyn
from hf_tpu.bounded_sizes import clean_factors as _clean
from hf_tpu.bounded_sizes import is_clean as _is_clean

aten = torch.ops.aten

# ------------------------------------------------------------------ sorts along a dynamic dimension, positions
# A MoE's dispatch (Transformers' grouped_mm experts): sort the token x top-k expert ids, gather each token's row
# by the sort's indices // top_k, grouped matmuls, and the inverse permutation (index_put of an arange) back to
# token order. A sort along a dynamic dimension is run with padded positions last (the padded flag is its first
# key, stable): its real positions are a prefix again, holding the sort of the real elements. Its indices are
# then *positions* in the sorted dimension's padded layout: real ones at real positions, padded ones at padded
# positions. Where that layout is merged ((2, s, k): the batch outside the sequence) those values differ from
# the unpadded program's, so such a tensor may only be used as positions: divided by an inner static factor
# (// k: the token's position), or as the index of index/index_put into a dimension of that layout.
SORTS = (aten.sort.default, aten.sort.stable)
_SHAPE_ONLY = {aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
               aten.sym_size.int}


def sort_args(n: torch.fx.Node) -> tuple[int, bool]:
    if n.target is aten.sort.stable:  # sort.stable(self, *, stable, dim=-1, descending=False)
        return n.kwargs.get("dim", -1), n.kwargs.get("descending", False)
    a = list(n.args[1:]) + [n.kwargs[k] for k in ("dim", "descending") if k in n.kwargs]
    return (a + [-1, False][len(a):])[0], (a + [-1, False][len(a):])[1]


def _layout(a: torch.fx.Node, factors: dict[torch.fx.Node, Factors]) -> Factors:
    return factors.get(a) or _clean(a.meta["val"])


def _sole_index(n: torch.fx.Node) -> torch.fx.Node | None:
    idx = n.args[1]
    return idx[0] if isinstance(idx, (list, tuple)) and len(idx) == 1 and isinstance(idx[0], torch.fx.Node) else None


def position_rule(n: torch.fx.Node, factors: dict[torch.fx.Node, Factors],
                   coords: dict[torch.fx.Node, tuple[Any, ...]]) -> bool:
    """Rules for tensors of positions (see above). Records n's factors and its values' layout in `coords`;
    True when n is handled; raises Unsupported where positions of a merged layout would be used as values."""
    t = n.target
    idx = _sole_index(n) if t in (aten.index.Tensor, aten.index_put.default) else None
    for a in n.all_input_nodes:
        if a in coords and not _is_clean([coords[a]]) and not (
                t in _SHAPE_ONLY or a is idx or t is aten.floor_divide.default and a is n.args[0]
                or t is operator.getitem and a.target in SORTS):  # (the sort's own entry: its indices')
            raise Unsupported(f"{t} uses positions in a merged dynamic dimension as values ({n.name})")
    if t is aten.arange.default and dyn_dims(n.meta["val"]) and not n.meta["val"].dtype.is_floating_point:
        coords[n] = (expr(n.meta["val"].shape[0]),)  # arange(s): position p holds p, unpadded too
        return False
    if t is operator.getitem and n.args[0].target in SORTS and n.args[1] == 1 and n.args[0] in coords:
        coords[n] = coords[n.args[0]]
        return True
    if t is aten.floor_divide.default and n.args[0] in coords and isinstance(n.args[1], int) and n.args[1] > 0:
        c, k = list(coords[n.args[0]]), n.args[1]
        while k > 1 and c and not is_dyn(c[-1]) and k % int(c[-1]) == 0:  # drop inner static factors
            k //= int(c.pop())
        if k == 1 and c:
            coords[n] = tuple(c)
        elif not _is_clean([coords[n.args[0]]]):
            raise Unsupported(f"{t} by {n.args[1]} splits a factor of a merged dynamic dimension ({n.name})")
        if n.args[0] in factors:  # elementwise (by a number): n's positions are its input's
            factors[n] = factors[n.args[0]]
        return n.args[0] in factors
    if t in SORTS:
        x = n.args[0]
        fx = _layout(x, factors)
        dim, descending = sort_args(n)
        dim %= len(fx)
        if not any(map(is_dyn, fx[dim])):
            return False
        if descending or sum(map(is_dyn, fx[dim])) != 1 or any(is_dyn(f) for d in range(len(fx)) if d != dim
                                                               for f in fx[d]):
            raise Unsupported(f"{t} sorts a dynamic dimension descending or beside another ({n.name})")
        coords[n] = fx[dim]  # the sort's output is in x's shape, every dimension clean: not in `factors`
        return True
    if idx is None or idx not in coords:
        return False
    x = n.args[0]
    fx, fi = _layout(x, factors), _layout(idx, factors)
    if not any(map(is_dyn, fx[0])) and t is aten.index.Tensor and _is_clean([coords[idx]]):
        return False  # a static table read at real positions (position embeddings by arange): the usual rule
    if fx[0] != coords[idx] and not (t is aten.index_put.default and x.target in (
            aten.empty_like.default, aten.empty.memory_format) and math.prod(coords[idx]) == expr(x.meta["val"].shape[0])):
        raise Unsupported(f"{t} by positions of another layout ({n.name})")
    if any(is_dyn(f) for dim in fx[1:] for f in dim) or len(fi) != 1:
        raise Unsupported(f"{t} by positions with other dynamic dimensions ({n.name})")
    if t is aten.index.Tensor:  # out[p] = x[idx[p]]: idx's real positions read x's real ones
        out = fi + fx[1:]
    else:  # out[idx[p]] = values[p]: real p write real positions only, padded p padded ones
        v = n.args[2]
        if not isinstance(v, torch.fx.Node) or _layout(v, factors)[:1] != fi or any(
                is_dyn(f) for dim in _layout(v, factors)[1:] for f in dim):
            raise Unsupported(f"{t} with values laid out otherwise than its positions ({n.name})")
        out = [coords[idx]] + fx[1:]
        if v in coords and idx.target is operator.getitem and idx.args[0].target in SORTS:
            # a sort's indices are a permutation: every position is written, so out holds positions (real ones
            # at real positions) as `v` does; other writes leave `x` elsewhere, whatever it holds
            coords[n] = coords[v]
    if not _is_clean(out):
        factors[n] = out
    return True
