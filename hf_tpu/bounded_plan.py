"""Bounded dynamism's plan of a graph (bounded.py): which ops could let padded positions reach real ones and
how each is masked, which take a dynamic size as a value, and which dynamic dimensions a view merges with
another; an op with no rule raises Unsupported (the graph then keeps static shapes)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_tpu.bounded_positions import SORTS, position_rule, sort_args
from hf_tpu.bounded_sizes import Factors, Unsupported, dyn_dims, expr, is_dyn
from hf_tpu.bounded_sizes import clean_factors as _clean
from hf_tpu.bounded_sizes import is_clean as _is_clean


aten = torch.ops.aten


# -------------------------------------------------------------------------------- which ops need what
# Ops whose output position p reads only input positions p along every dimension (or none): padded
# positions never reach real ones.
_LAYOUT = {
    aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.clone.default, aten.alias.default,
    aten._to_copy.default, aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default,
    aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
    aten.scalar_tensor.default, aten.arange.default, aten.arange.start, aten.arange.start_step,
    aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
    aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
    aten.cumsum.default, aten.copy.default, aten.floor_divide.default,  # (repeat tiles: graph_plan merges its factors) aten.tril.default, aten.triu.default,
    # elementwise without ATen's pointwise tag, and complex views that only fold or unfold the last dimension
    # (always the static pair of a complex number): DeepSeek-V2's rotary embedding (polar, view_as_complex)
    aten.polar.default, aten.complex.default, aten.view_as_complex.default, aten.view_as_real.default,
}
# consumers that may take a dynamic size as a *shape* (at the bucket's bound inside the program)
_SIZE_CONSUMERS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default, aten.zeros.default,
    aten.ones.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_ones.default,
    aten.new_empty.default, aten.new_full.default, aten.slice.Tensor, aten.repeat.default,
    aten._assert_scalar.default, aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default,
}
_SYM_ARITH = {operator.mul, operator.add, operator.sub, operator.floordiv, operator.neg,
              operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
              torch.sym_max, torch.sym_min, torch.sym_not}
# reductions: (op, position of dim argument, fill of masked positions: "zero", "one", "min", "max", "false",
# "true"; "mean" rescales a zero-filled mean by padded/real counts)
_REDUCE = {
    aten.sum.dim_IntList: (1, "zero"), aten.sum.default: (None, "zero"),
    aten.mean.dim: (1, "mean"), aten.mean.default: (None, "mean"),
    aten.amax.default: (1, "min"), aten.amin.default: (1, "max"),
    aten.max.dim: (1, "min"), aten.min.dim: (1, "max"), aten.argmax.default: (1, "min"),
    aten.argmin.default: (1, "max"), aten.any.dim: (1, "false"), aten.any.dims: (1, "false"),
    aten.any.default: (None, "false"), aten.all.dim: (1, "true"), aten.all.default: (None, "true"),
    aten.prod.dim_int: (1, "one"), aten.logsumexp.default: (1, "min"),
    aten._softmax.default: (1, "min"), aten._log_softmax.default: (1, "min"),
}
_ALONG_DIM = {aten.split.Tensor: (2, 0), aten.split_with_sizes.default: (2, 0), aten.unbind.int: (1, 0),
              aten.narrow.default: (1, 0), aten.chunk.default: (2, 0)}
# ops computing each output row from its own input row along `dim` (position, default): on a merged
# dynamic dimension only along a static one
_ROWWISE = {aten.topk.default: (2, -1), aten.sort.default: (1, -1), aten.sort.stable: (2, -1)}
_MATMUL = {aten.mm.default: 0, aten.bmm.default: 0, aten.addmm.default: 1, aten.baddbmm.default: 1}


@dataclass
class Mask:
    """Mask argument `arg` along `dims` (its dimensions whose size is dynamic) with `fill` before the op."""

    masks: list[tuple[int, list[int], str]]  # (argument position, dims, fill)
    rescale: list[int] = field(default_factory=list)  # for mean: the reduced dynamic dims of argument 0
    factors: dict[tuple[int, int], tuple[Any, ...]] = field(default_factory=dict)  # (arg, dim) -> merged factors


def _reduced_dims(node: torch.fx.Node, pos: int | None, rank: int) -> list[int]:
    if pos is None:
        return list(range(rank))
    dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim")
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0 and node.target in (
            aten.amax.default, aten.amin.default)):
        return list(range(rank))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return [d % rank if rank else 0 for d in dims]


def regroup(src: Factors, out_shape: Sequence[Any]) -> Factors | None:
    """A view's output dimensions as groups of the input's factors, splitting static factors only: a batch
    merged with the sequence ([2, s, 16] -> [2s, 16]) is the factors (2, s): padded, the real positions of
    each batch row are still the first s of its block, and the view back restores them. None when a
    dynamic factor would have to be split."""
    import sympy

    flat = [f for dim in src for f in dim if f != 1]
    out: Factors = []
    i = 0
    for o in (expr(x) for x in out_shape):
        if o == 1:
            out.append(())
            continue
        group: list[Any] = []
        p: Any = 1
        while sympy.simplify(p - o) != 0:
            if i >= len(flat) or len(group) > 64:
                return None
            f, rest = flat[i], sympy.simplify(sympy.sympify(o) / p)
            if isinstance(f, int) and isinstance(rest, sympy.Integer) and int(rest) < f:
                if f % int(rest):
                    return None
                group.append(int(rest))
                flat[i] = f // int(rest)
                p = o
                break
            group.append(f)
            p = p * f
            i += 1
        out.append(tuple(group))
    if any(f != 1 for f in flat[i:]):
        return None
    # a dynamic factor outermost in its group keeps real positions a prefix: [s, 12] -> [12s] is clean
    return [(math.prod(g[1:], start=g[0]),) if len(g) > 1 and is_dyn(g[0]) and not any(map(is_dyn, g[1:]))
            else g for g in out]


def view_ok(src: Any, out: Any) -> bool:
    r = regroup(_clean(src), out.shape)
    return r is not None and _is_clean(r)


def _rule(node: torch.fx.Node) -> Mask | None | str:
    """None: safe as is; Mask: safe once masked; str: why the graph cannot be padded."""
    t = node.target
    val = node.meta.get("val")
    ins = [a for a in node.args if isinstance(a, torch.fx.Node)]
    ins += [a for a in node.args if isinstance(a, (list, tuple)) for a in a if isinstance(a, torch.fx.Node)]
    in_vals = [a.meta.get("val") for a in ins]
    touches = any(dyn_dims(v) for v in in_vals) or bool(dyn_dims(val))
    if not touches:
        return None
    if isinstance(t, torch._ops.OpOverload) and (torch.Tag.pointwise in t.tags or t in _LAYOUT):
        return None
    if t is operator.getitem:
        return None
    x = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None if view_ok(x, val) else f"{t} merges the dynamic dimension with an outer one"
    if t is aten.slice.Tensor:
        dim = node.args[1] if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        if not is_dyn(x.shape[dim]):
            return None
        if isinstance(start, int) and start >= 0 or start is None:
            return None
        step = node.args[4] if len(node.args) > 4 else 1
        if step == 1 and isinstance(val, torch.Tensor) and expr(val.shape[dim]) == expr(x.shape[dim]):
            # the whole dimension: a negative start beyond every length the bound allows clamps to 0 (a
            # sliding window's x[:, -window:] with window >= the bound; AFMoE's cache slice)
            return None
        return f"{t} starts at {start} along the dynamic dimension (reads padded positions)"
    if t in _ROWWISE:
        pos, default = _ROWWISE[t]
        dim = (node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)) % x.dim()
        return None if not is_dyn(x.shape[dim]) else f"{t} reorders the dynamic dimension"
    if t is aten.slice_scatter.default:
        # out = x with out[start:end:step] along dim replaced by src
        src = node.args[1].meta["val"]
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % x.dim()
        if not is_dyn(x.shape[dim]) and not is_dyn(src.shape[dim]):
            # a write along a static dimension (DeepSeek-V2's and GLM-4-MoE-Lite's rotary half written into
            # the head): every other dimension of src is x's, so out's position p along a dynamic one reads
            # x's or src's position p, never another
            return None
        return f"{t} writes along the dynamic dimension"
    if t is aten.select.int:
        dim, index = node.args[1], node.args[2]
        if not is_dyn(x.shape[dim]) or (isinstance(index, int) and index >= 0):
            return None
        return f"{t} picks index {index} along the dynamic dimension"
    if t in _ALONG_DIM:  # split/unbind/narrow along a static dimension move nothing along a dynamic one
        pos, default = _ALONG_DIM[t]
        dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)
        return None if not is_dyn(x.shape[dim % x.dim()]) else f"{t} splits the dynamic dimension"
    if t is aten.stack.default:
        # a new dimension: stack's inputs share one shape, so each one's padded positions stay padded positions
        # (Cohere2's rotary embedding stacks cos/sin halves)
        return None
    if t is aten.cat.default:
        dim = node.args[1] if len(node.args) > 1 else 0
        parts = [p.meta["val"] for p in node.args[0]]
        dim = dim % parts[0].dim()
        if all(not is_dyn(p.shape[dim]) for p in parts[:-1]):
            return None
        return f"{t} joins along the dynamic dimension after a dynamic part"
    if t in (aten.embedding.default,):
        return None if not dyn_dims(x) else f"{t} looks up a table with a dynamic dimension"
    if t in (aten.index_select.default, aten.gather.default):
        dim = node.args[1] % max(x.dim(), 1)
        return None if not is_dyn(x.shape[dim]) else f"{t} reads along the dynamic dimension by index"
    if t is aten.index.Tensor:
        idx = node.args[1]
        if all(i is None or not is_dyn(x.shape[d]) for d, i in enumerate(idx)):
            return None
        return f"{t} indexes the dynamic dimension"
    if t is aten.histc.default:
        # elements outside [min, max] are not counted (torchax's jnp.histogram drops them), so padded positions
        # filled below `min` leave the counts real; min == max means the input's own range: no rule
        lo, hi = (list(node.args[2:4]) + [0, 0])[:2]
        floor = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and floor < lo < hi < math.inf:
            return Mask([(0, dyn_dims(x), "min")])
        return f"{t} without a finite range counts padded positions"
    if t is aten._grouped_mm.default:
        # tokens x experts (a MoE's experts after the dispatch sort): output row p is input row p times its
        # group's weight, groups by position from `offs`; the real rows are a prefix, so with offs from real rows
        # (a masked histc) each real row keeps its group; rows past offs[-1] are zero
        b, offs = node.args[1].meta["val"], node.args[2] if len(node.args) > 2 else None
        if x.dim() == 2 and b.dim() == 3 and offs is not None and not is_dyn(x.shape[1]) \
                and not dyn_dims(b) and not dyn_dims(offs.meta["val"]):
            return None
        return f"{t} groups along the dynamic dimension"
    if t is aten.native_layer_norm.default:
        k = len(node.args[1])
        return None if not any(map(is_dyn, x.shape[-k:])) else f"{t} normalises over the dynamic dimension"
    if t in _REDUCE:
        pos, fill = _REDUCE[t]
        dims = [d for d in _reduced_dims(node, pos, x.dim()) if is_dyn(x.shape[d])]
        if not dims:
            return None
        if fill == "mean":
            return Mask([(0, dims, "zero")], rescale=dims)
        return Mask([(0, dims, fill)])
    if t in _MATMUL:
        off = _MATMUL[t]
        a, b = node.args[off].meta["val"], node.args[off + 1].meta["val"]
        if not is_dyn(a.shape[-1]):
            return None
        return Mask([(off, [a.dim() - 1], "zero"), (off + 1, [b.dim() - 2], "zero")])
    return f"{t} has no bounded-dynamism rule"


def _symint_uses(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[int]]:
    """A dynamic size is a shape inside the program (the bucket's bound there); where a pointwise op takes it
    as a value (`x / n`: a mean's backward), that argument gets the real size, traced. Returns those
    (node -> argument positions); raises Unsupported for any other use."""
    values: dict[torch.fx.Node, list[int]] = {}
    for n in gm.graph.nodes:
        if not isinstance(n.meta.get("val"), torch.SymInt | torch.SymBool) or not is_dyn(n.meta["val"]):
            continue
        for user in n.users:
            if user.op == "output" or user.target in _SIZE_CONSUMERS or user.target in _SYM_ARITH:
                if user.target is aten.slice.Tensor and n in user.args[:3]:
                    raise Unsupported(f"{user.target} starts or slices by the dynamic size")
                continue
            t = user.target
            if isinstance(t, torch._ops.OpOverload) and (torch.Tag.pointwise in t.tags
                                                          or t is aten.scalar_tensor.default):
                if n in user.kwargs.values() or isinstance(n.meta["val"], torch.SymBool):
                    raise Unsupported(f"{t} takes the dynamic size as a keyword")
                values.setdefault(user, []).extend(i for i, a in enumerate(user.args) if a is n)
                continue
            raise Unsupported(f"{t} uses the dynamic size as a value")
    return values


_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_SAME = {aten.clone.default, aten.alias.default, aten._to_copy.default, aten.detach.default,
         aten.contiguous.default, aten.lift_fresh_copy.default,
         # constants of the input's shape: each position is its own
         aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default}
# index ops reading or writing along `dim` (position 1) of each row: on a merged dynamic dimension only along a
# static one, with index (and src) merged exactly as the input elsewhere; (index position, src position or None)
_ROW_INDEXED = {aten.gather.default: (2, None), aten.scatter.src: (2, 3), aten.scatter.value: (2, None),
                aten.scatter_add.default: (2, 3), aten.scatter.reduce: (2, 3), aten.scatter.value_reduce: (2, None)}


def _with_static(fx: Factors, val: Any, dims: Sequence[int]) -> Factors | None:
    """fx with the static dimensions `dims` resized to val's (None if one of them holds a dynamic factor)."""
    if any(is_dyn(f) for d in dims for f in fx[d]):
        return None
    clean = _clean(val)
    return [clean[d] if d in dims else fx[d] for d in range(len(fx))]


def _factored_rule(n: torch.fx.Node, factors: dict[torch.fx.Node, Factors]) -> Factors | str | tuple[Factors, Mask]:
    """The factors of `n`'s output when an input's dynamic dimension is merged with another (a view did
    that); only ops that keep every position's meaning may see such a tensor."""
    t, val = n.target, n.meta.get("val")
    x = n.args[0] if n.args else None
    fx = factors.get(x) if isinstance(x, torch.fx.Node) else None
    if t in _SAME and fx is not None:
        return fx
    if t is aten.permute.default and fx is not None:
        return [fx[d % len(fx)] for d in n.args[1]]
    if t is aten.transpose.int and fx is not None:
        i, j = n.args[1] % len(fx), n.args[2] % len(fx)
        out = list(fx)
        out[i], out[j] = fx[j], fx[i]
        return out
    if t is aten.t.default and fx is not None:
        return fx[::-1]
    if t is aten.unsqueeze.default and fx is not None:
        d = n.args[1] % (len(fx) + 1)
        return fx[:d] + [()] + fx[d:]
    if t is aten.expand.default and fx is not None:
        # broadcasting size-1 dimensions (GLM-4-MoE's grouped top-k: the group mask over each group's experts):
        # a dimension that keeps its size keeps its factors, a broadcast one holds one value at every position
        lead, clean = val.dim() - len(fx), _clean(val)
        return clean[:lead] + [fx[d] if expr(val.shape[lead + d]) == math.prod(fx[d], start=1) else clean[lead + d]
                               for d in range(len(fx))]
    if t is aten.sym_size.int:  # a size, not positions
        return []
    if t is operator.getitem and fx is not None:
        # an output of topk/sort/max.dim/split below: the same factors, but a split's static dimension is the piece's
        if not isinstance(val, torch.Tensor) or val.dim() != len(fx):
            return f"{t} of a merged dynamic tensor changes its rank"
        changed = [d for d in range(len(fx)) if expr(val.shape[d]) != math.prod(fx[d], start=1)]
        r = _with_static(fx, val, changed)
        return r if r is not None else f"{t} takes part of a merged dynamic dimension"
    if t in _ALONG_DIM and fx is not None:  # split/narrow/chunk along a static dimension
        pos, default = _ALONG_DIM[t]
        dim = (n.args[pos] if len(n.args) > pos else n.kwargs.get("dim", default)) % len(fx)
        first = val[0] if isinstance(val, (list, tuple)) else val
        r = _with_static(fx, first, [dim])
        return r if r is not None else f"{t} splits a dynamic dimension merged with another by a view"
    if t is aten.repeat.default and fx is not None:
        # tiling: output row k * size + j is input row j, so each tiled dimension gains an outer static factor
        reps = list(n.args[1])
        lead = reps[: len(reps) - len(fx)]
        tiled = [(r,) if not dim else ((r,) + dim if r != 1 else dim) for r, dim in zip(reps[len(lead):], fx, strict=True)]
        return [(r,) if r != 1 else () for r in lead] + tiled
    if t in _ROW_INDEXED and fx is not None:
        ipos, spos = _ROW_INDEXED[t]
        dim = n.args[1] % len(fx)
        others = [n.args[ipos]] + ([n.args[spos]] if spos is not None else [])
        rest = [d for d in range(len(fx)) if d != dim]
        for a in others:
            if not isinstance(a, torch.fx.Node):
                return f"{t} on a merged dynamic tensor with a non-tensor index"
            fa = factors.get(a, _clean(a.meta["val"]))
            if len(fa) != len(fx) or any(fa[d] != fx[d] for d in rest):
                return f"{t} with an index merged differently from its input"
        r = _with_static(fx, val, [dim])
        return r if r is not None else f"{t} reads or writes along a dynamic dimension merged with another"
    if fx is not None and (t in _REDUCE or t in _ROWWISE):
        # along static dimensions only (a MoE router's softmax/topk over the experts of each token): every other
        # position, the merged token one included, is computed from its own row, so padded rows stay padded
        rank = len(fx)
        if t in _REDUCE:
            dims = _reduced_dims(n, _REDUCE[t][0], rank)
        else:
            pos, default = _ROWWISE[t]
            dims = [(n.args[pos] if len(n.args) > pos else n.kwargs.get("dim", default)) % rank]
        if any(is_dyn(f) for d in dims for f in fx[d]):
            return f"{t} reduces or reorders a dynamic dimension merged with another by a view"
        first = val[0] if isinstance(val, (list, tuple)) else val
        if not isinstance(first, torch.Tensor):
            return f"{t} on a dynamic dimension merged with another by a view"
        if first.dim() == rank:
            return [_clean(first)[d] if d in dims else fx[d] for d in range(rank)]
        return [fx[d] for d in range(rank) if d not in dims]
    if t in _MATMUL:
        off = _MATMUL[t]
        a, b = n.args[off], n.args[off + 1]
        fa, fb = factors.get(a, _clean(a.meta["val"])), factors.get(b, _clean(b.meta["val"]))
        ca, cb = fa[-1], fb[-2]
        if off and factors.get(n.args[0]) is not None or not _is_clean(fb[:-2]):
            return f"{t} adds or batches a merged dynamic tensor"
        if not any(map(is_dyn, ca + cb)):
            return fa[:-1] + fb[-1:]
        if ca != cb or sum(map(is_dyn, ca)) != 1:
            return f"{t} contracts over dynamic dimensions merged differently"
        # a weight gradient: the contraction runs over the batch merged with the sequence; padded rows masked
        da, db = a.meta["val"].dim() - 1, b.meta["val"].dim() - 2
        return fa[:-1] + fb[-1:], Mask([(off, [da], "zero"), (off + 1, [db], "zero")],
                                       factors={(off, da): ca, (off + 1, db): cb})
    if isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags and isinstance(val, torch.Tensor):
        out: Factors = _clean(val)
        nd = val.dim()
        for j in range(nd):
            picked = None
            for a in n.args:
                v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                if not isinstance(v, torch.Tensor) or v.dim() < nd - j:
                    continue
                k = v.dim() - (nd - j)
                if expr(v.shape[k]) != expr(val.shape[j]) or not is_dyn(v.shape[k]):
                    continue
                f = factors.get(a, _clean(v))[k]
                if picked is not None and f != picked:
                    return f"{t} combines tensors whose dynamic dimension is merged differently"
                picked = f
            if picked is not None:
                out[j] = picked
        return out
    return f"{t} on a dynamic dimension merged with another by a view"


@dataclass
class Plan:
    masks: dict[torch.fx.Node, Mask]  # ops whose inputs' padded positions are masked first
    values: dict[torch.fx.Node, list[int]]  # ops taking a dynamic size as a value: those arguments get the real one
    out_factors: dict[int, Factors]  # outputs (by leaf index) whose dynamic dimension a view merged with another
    sorts: dict[torch.fx.Node, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)  # padded last: dim, factors


def graph_plan(gm: torch.fx.GraphModule) -> Plan:
    """What a padded run of `gm` needs; raises Unsupported naming the op that cannot be padded."""
    values = _symint_uses(gm)
    masks: dict[torch.fx.Node, Mask] = {}
    factors: dict[torch.fx.Node, Factors] = {}  # only the tensors with a merged dynamic dimension
    out_factors: dict[int, Factors] = {}
    coords: dict[torch.fx.Node, tuple[Any, ...]] = {}  # tensors of positions: the layout their values index
    sorts: dict[torch.fx.Node, tuple[int, tuple[Any, ...]]] = {}
    for n in gm.graph.nodes:
        if n.op == "output":  # a merged output is sliced factor by factor (PaddedGraph.unpad)
            leaves = torch.utils._pytree.tree_leaves(n.args[0])
            if any(leaf in coords and not _is_clean([coords[leaf]]) for leaf in leaves if isinstance(leaf, torch.fx.Node)):
                raise Unsupported("an output holds positions in a merged dynamic dimension")
            out_factors = {i: factors[leaf] for i, leaf in enumerate(leaves)
                           if isinstance(leaf, torch.fx.Node) and leaf in factors}
            continue
        if n.op != "call_function":
            continue
        if position_rule(n, factors, coords):
            if n.target in SORTS:
                sorts[n] = (sort_args(n)[0] % n.args[0].meta["val"].dim(), coords[n])
            continue
        ins = [a for a in n.args if isinstance(a, torch.fx.Node)]
        if n.target in _VIEWS:
            src = n.args[0]
            r = regroup(factors.get(src, _clean(src.meta["val"])), n.meta["val"].shape)
            if r is None:
                raise Unsupported(f"{n.target} splits a dynamic dimension ({n.name}: "
                                  f"{src.meta['val'].shape} -> {n.meta['val'].shape})")
            if not _is_clean(r):
                factors[n] = r
            continue
        if n.target is aten.repeat.default and n.args[0] not in factors:
            # tiling a dynamic dimension puts real rows at j and size + j: the dimension is then (reps, size),
            # tracked as merged, never a prefix of real rows
            r = _factored_rule(n, {n.args[0]: _clean(n.args[0].meta["val"])})
            if not _is_clean(r):
                factors[n] = r
            continue
        if any(a in factors for a in ins):
            r = _factored_rule(n, factors)
            if isinstance(r, str):
                raise Unsupported(f"{r} ({n.name})")
            if isinstance(r, tuple):
                r, masks[n] = r
            if not _is_clean(r):
                factors[n] = r
            continue
        r = _rule(n)
        if isinstance(r, str):
            raise Unsupported(f"{r} ({n.name}: {[a.meta.get('val') for a in ins]} -> {n.meta.get('val')})")
        if r is not None:
            masks[n] = r
    return Plan(masks, values, out_factors, sorts)
