"""Bounded dynamism, as TorchTPU has it (experimental there too): a dimension marked with
`torch._dynamo.mark_dynamic(t, dim, min=..., max=...)` reaches `torch.compile(..., backend="tpu")` as a
symbol, and ONE XLA program per bucket serves every size in that bucket: inputs are padded to the bucket's
upper bound, the padded positions are masked where they could reach real ones, and outputs are sliced back.

Buckets are TorchTPU's: consecutive multiples of `bucket_size` (option, default 128) starting at the first
that holds the traced size, `num_dynamic_buckets` of them (option, 1-8, default 1), the last extended to the
`max` given to mark_dynamic; bound checks on the symbols make Dynamo recompile outside them. On TPU, XLA's
dynamic padder does the masking (set_dimension_size); JAX has no bounded shapes, so here each op that could
let padded positions reach real ones is either masked (reductions, softmax, matmul contractions over the
dynamic dim) or, if it has no rule (graph_plan names it), the graph keeps static shapes, one program per
size, as before: exact either way, never padded wrong.

A position is real when its index along a dynamic dimension is below that dimension's size (its symbolic
size evaluated at the call's actual values, passed into the program as a traced argument)."""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)
aten = torch.ops.aten

# ---------------------------------------------------------------------------------------- symbolic sizes


def _expr(x: Any) -> Any:
    """The sympy expression of a SymInt (an int stays an int)."""
    return x.node.expr if isinstance(x, torch.SymInt) else x


def _is_dyn(x: Any) -> bool:
    e = _expr(x)
    return not isinstance(e, int) and bool(getattr(e, "free_symbols", None))


def _dyn_dims(val: Any) -> list[int]:
    return [d for d, s in enumerate(val.shape) if _is_dyn(s)] if isinstance(val, torch.Tensor) else []


class Unsupported(Exception):
    """A graph (or size expression) bounded dynamism has no rule for: the graph keeps static shapes."""


def evaluate(expr: Any, env: dict[Any, Any]) -> Any:
    """`expr` (Integer, Symbol, +, *) at the symbols' values in `env` (ints or traced JAX scalars)."""
    import sympy

    if isinstance(expr, int):
        return expr
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    if isinstance(expr, sympy.Add):
        return sum((evaluate(a, env) for a in expr.args[1:]), evaluate(expr.args[0], env))
    if isinstance(expr, sympy.Mul):
        return math.prod((evaluate(a, env) for a in expr.args[1:]), start=evaluate(expr.args[0], env))
    raise Unsupported(f"size expression {expr}")


def _coefficient(expr: Any, sym: Any) -> int | None:
    """k when expr == k*sym (k a positive int), else None."""
    import sympy

    k = sympy.simplify(sympy.sympify(expr) / sym)
    return int(k) if isinstance(k, sympy.Integer) and k > 0 else None


# ---------------------------------------------------------------------------------------------- buckets


@dataclass
class Buckets:
    """Per bucket, each symbol's upper bound; buckets cover [lower, upper] of every symbol contiguously."""

    symbols: list[Any]
    uppers: list[dict[Any, int]]
    lower: dict[Any, int]

    def index(self, values: dict[Any, int]) -> int:
        for i, ups in enumerate(self.uppers):
            if all(values[s] <= ups[s] for s in self.symbols):
                return i
        raise ValueError(f"dynamic sizes {values} exceed the compiled buckets {self.uppers}")


def make_buckets(symbols: Sequence[Any], ranges: dict[Any, tuple[int, int | None]], hints: dict[Any, int],
                 num_buckets: int, bucket_size: int) -> Buckets:
    """TorchTPU's buckets: the first upper bound is the first multiple of `bucket_size` at or above the traced
    size (and above the lower bound), each next one `bucket_size` further, the last extended to the finite
    `max` if there is one; a symbol that reached its max stays there."""
    per_symbol: dict[Any, list[int]] = {}
    for s in symbols:
        lower, upper = ranges[s]
        start = max(lower, hints[s])
        first = -(-start // bucket_size) * bucket_size
        if first <= lower and (upper is None or upper > lower):
            first += bucket_size
        ups: list[int] = []
        for i in range(num_buckets):
            last = i == num_buckets - 1
            cand = upper if (last and upper is not None) else first + i * bucket_size
            if upper is not None:
                cand = min(cand, upper)
            if ups and cand <= ups[-1]:
                cand = ups[-1]
            ups.append(cand)
        per_symbol[s] = ups
    uppers: list[dict[Any, int]] = []
    for i in range(num_buckets):
        b = {s: per_symbol[s][i] for s in symbols}
        if uppers and b == uppers[-1]:
            break  # every symbol reached its max
        uppers.append(b)
    return Buckets(list(symbols), uppers, {s: ranges[s][0] for s in symbols})


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
    aten.cumsum.default, aten.repeat.default, aten.copy.default, aten.tril.default, aten.triu.default,
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


Factors = list[tuple[Any, ...]]  # per dimension, the row-major factors it is made of (size-1 factors dropped)


def _clean(val: Any) -> Factors:
    return [(_expr(x),) for x in val.shape] if isinstance(val, torch.Tensor) else []


def _is_clean(f: Factors) -> bool:
    return all(len(dim) <= 1 or not any(_is_dyn(x) for x in dim) for dim in f)


def regroup(src: Factors, out_shape: Sequence[Any]) -> Factors | None:
    """A view's output dimensions as groups of the input's factors, splitting static factors only: a batch
    merged with the sequence ([2, s, 16] -> [2s, 16]) is the factors (2, s): padded, the real positions of
    each batch row are still the first s of its block, and the view back restores them. None when a
    dynamic factor would have to be split."""
    import sympy

    flat = [f for dim in src for f in dim if f != 1]
    out: Factors = []
    i = 0
    for o in (_expr(x) for x in out_shape):
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
    return [(math.prod(g[1:], start=g[0]),) if len(g) > 1 and _is_dyn(g[0]) and not any(map(_is_dyn, g[1:]))
            else g for g in out]


def _view_ok(src: Any, out: Any) -> bool:
    r = regroup(_clean(src), out.shape)
    return r is not None and _is_clean(r)


def _rule(node: torch.fx.Node) -> Mask | None | str:
    """None: safe as is; Mask: safe once masked; str: why the graph cannot be padded."""
    t = node.target
    val = node.meta.get("val")
    ins = [a for a in node.args if isinstance(a, torch.fx.Node)]
    ins += [a for a in node.args if isinstance(a, (list, tuple)) for a in a if isinstance(a, torch.fx.Node)]
    in_vals = [a.meta.get("val") for a in ins]
    touches = any(_dyn_dims(v) for v in in_vals) or bool(_dyn_dims(val))
    if not touches:
        return None
    if isinstance(t, torch._ops.OpOverload) and (torch.Tag.pointwise in t.tags or t in _LAYOUT):
        return None
    if t is operator.getitem:
        return None
    x = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None if _view_ok(x, val) else f"{t} merges the dynamic dimension with an outer one"
    if t is aten.slice.Tensor:
        dim = node.args[1] if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        if not _is_dyn(x.shape[dim]):
            return None
        if isinstance(start, int) and start >= 0 or start is None:
            return None
        return f"{t} starts at {start} along the dynamic dimension (reads padded positions)"
    if t is aten.select.int:
        dim, index = node.args[1], node.args[2]
        if not _is_dyn(x.shape[dim]) or (isinstance(index, int) and index >= 0):
            return None
        return f"{t} picks index {index} along the dynamic dimension"
    if t in _ALONG_DIM:  # split/unbind/narrow along a static dimension move nothing along a dynamic one
        pos, default = _ALONG_DIM[t]
        dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)
        return None if not _is_dyn(x.shape[dim % x.dim()]) else f"{t} splits the dynamic dimension"
    if t is aten.cat.default:
        dim = node.args[1] if len(node.args) > 1 else 0
        parts = [p.meta["val"] for p in node.args[0]]
        dim = dim % parts[0].dim()
        if all(not _is_dyn(p.shape[dim]) for p in parts[:-1]):
            return None
        return f"{t} joins along the dynamic dimension after a dynamic part"
    if t in (aten.embedding.default,):
        return None if not _dyn_dims(x) else f"{t} looks up a table with a dynamic dimension"
    if t in (aten.index_select.default, aten.gather.default):
        dim = node.args[1] % max(x.dim(), 1)
        return None if not _is_dyn(x.shape[dim]) else f"{t} reads along the dynamic dimension by index"
    if t is aten.index.Tensor:
        idx = node.args[1]
        if all(i is None or not _is_dyn(x.shape[d]) for d, i in enumerate(idx)):
            return None
        return f"{t} indexes the dynamic dimension"
    if t is aten.native_layer_norm.default:
        k = len(node.args[1])
        return None if not any(map(_is_dyn, x.shape[-k:])) else f"{t} normalises over the dynamic dimension"
    if t in _REDUCE:
        pos, fill = _REDUCE[t]
        dims = [d for d in _reduced_dims(node, pos, x.dim()) if _is_dyn(x.shape[d])]
        if not dims:
            return None
        if fill == "mean":
            return Mask([(0, dims, "zero")], rescale=dims)
        return Mask([(0, dims, fill)])
    if t in _MATMUL:
        off = _MATMUL[t]
        a, b = node.args[off].meta["val"], node.args[off + 1].meta["val"]
        if not _is_dyn(a.shape[-1]):
            return None
        return Mask([(off, [a.dim() - 1], "zero"), (off + 1, [b.dim() - 2], "zero")])
    return f"{t} has no bounded-dynamism rule"


def _symint_uses(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[int]]:
    """A dynamic size is a shape inside the program (the bucket's bound there); where a pointwise op takes it
    as a value (`x / n`: a mean's backward), that argument gets the real size, traced. Returns those
    (node -> argument positions); raises Unsupported for any other use."""
    values: dict[torch.fx.Node, list[int]] = {}
    for n in gm.graph.nodes:
        if not isinstance(n.meta.get("val"), torch.SymInt | torch.SymBool) or not _is_dyn(n.meta["val"]):
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
         aten.contiguous.default, aten.lift_fresh_copy.default}


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
    if t in _MATMUL:
        off = _MATMUL[t]
        a, b = n.args[off], n.args[off + 1]
        fa, fb = factors.get(a, _clean(a.meta["val"])), factors.get(b, _clean(b.meta["val"]))
        ca, cb = fa[-1], fb[-2]
        if off and factors.get(n.args[0]) is not None or not _is_clean(fb[:-2]):
            return f"{t} adds or batches a merged dynamic tensor"
        if not any(map(_is_dyn, ca + cb)):
            return fa[:-1] + fb[-1:]
        if ca != cb or sum(map(_is_dyn, ca)) != 1:
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
                if _expr(v.shape[k]) != _expr(val.shape[j]) or not _is_dyn(v.shape[k]):
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


def graph_plan(gm: torch.fx.GraphModule) -> Plan:
    """What a padded run of `gm` needs; raises Unsupported naming the op that cannot be padded."""
    values = _symint_uses(gm)
    masks: dict[torch.fx.Node, Mask] = {}
    factors: dict[torch.fx.Node, Factors] = {}  # only the tensors with a merged dynamic dimension
    out_factors: dict[int, Factors] = {}
    for n in gm.graph.nodes:
        if n.op == "output":  # a merged output is sliced factor by factor (PaddedGraph.unpad)
            out_factors = {i: factors[leaf] for i, leaf in enumerate(torch.utils._pytree.tree_leaves(n.args[0]))
                           if isinstance(leaf, torch.fx.Node) and leaf in factors}
            continue
        if n.op != "call_function":
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
    return Plan(masks, values, out_factors)


# -------------------------------------------------------------------------------- masking in the program


def _fill_value(fill: str, dtype: Any) -> Any:
    import jax.numpy as jnp

    if fill in ("zero", "false"):
        return jnp.zeros((), dtype)
    if fill in ("one", "true"):
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if fill == "min" else jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(fill == "max", dtype)
    info = jnp.iinfo(dtype)
    return jnp.array(info.min if fill == "min" else info.max, dtype)


def _real(shape_exprs: Sequence[Any], padded_shape: Sequence[int], dims: Sequence[int],
          env: dict[Any, Any], factors: dict[int, tuple[Any, ...]] | None = None) -> Any:
    """Boolean array broadcastable to the padded shape: True at real positions along `dims`. A dimension
    made of factors (a batch merged with the sequence) is real where its dynamic factor's index is."""
    import jax.numpy as jnp

    mask = None
    for d in dims:
        shape = [1] * len(padded_shape)
        shape[d] = padded_shape[d]
        idx = jnp.arange(padded_shape[d])
        f = (factors or {}).get(d)
        if f is not None and len(f) > 1:
            k = next(i for i, x in enumerate(f) if _is_dyn(x))
            inner = math.prod(int(x) for x in f[k + 1:])
            padded_dyn = padded_shape[d] // math.prod(int(x) for x in f if not _is_dyn(x))
            m = ((idx // inner) % padded_dyn).reshape(shape) < evaluate(f[k], env)
        else:
            m = idx.reshape(shape) < evaluate(shape_exprs[d], env)
        mask = m if mask is None else mask & m
    return mask


def real_values(fn: Callable[..., Any], node: torch.fx.Node, positions: list[int],
                env: Callable[[], dict[Any, Any]]) -> Callable[..., Any]:
    """`fn` with the dynamic sizes it takes as values (at `positions`) replaced by the real ones, traced."""

    def call(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for i in positions:
            args[i] = evaluate(_expr(node.args[i].meta["val"]), env())
        return fn(*args, **kwargs)

    return call


def masked(fn: Callable[..., Any], node: torch.fx.Node, spec: Mask,
           env: Callable[[], dict[Any, Any]]) -> Callable[..., Any]:
    """`fn` (the node's lowering) with padded positions of its inputs masked as `spec` says."""
    import jax.numpy as jnp

    def call(*args: Any, **kwargs: Any) -> Any:
        sizes = env()
        args = list(args)
        for pos, dims, fill in spec.masks:
            x = args[pos]
            exprs = [_expr(s) for s in node.args[pos].meta["val"].shape]
            fac = {d: f for (p, d), f in spec.factors.items() if p == pos}
            args[pos] = jnp.where(_real(exprs, x.shape, dims, sizes, fac), x, _fill_value(fill, x.dtype))
        out = fn(*args, **kwargs)
        if spec.rescale:
            x = args[0]
            exprs = [_expr(s) for s in node.args[0].meta["val"].shape]
            padded = math.prod(x.shape[d] for d in spec.rescale)
            real = math.prod((evaluate(exprs[d], sizes) for d in spec.rescale), start=1)
            out = out * (padded / real).astype(out.dtype)
        return out

    return call


# ----------------------------------------------------------------------------------- a graph's padded run


class PaddedGraph:
    """What `_compiler` needs to run one graph padded to buckets: the call's symbol values, the padded
    arguments (dynamic sizes at the bucket's bound, tensors padded with zeros), the real sizes as a traced
    argument, and the outputs sliced back."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any]) -> None:
        from torch.utils import _pytree as pytree
        from torch.utils._sympy.numbers import int_oo

        self.plan = graph_plan(gm)
        self.masks = self.plan.masks
        self.locate: dict[Any, tuple[int, int | None]] = {}
        self.arg_exprs: list[Any] = []
        shape_env = None
        for i, ex in enumerate(example_inputs):
            if isinstance(ex, torch.SymInt):
                e = _expr(ex)
                self.arg_exprs.append(e)
                shape_env = shape_env or ex.node.shape_env
                if _is_dyn(ex) and len(e.free_symbols) == 1 and e in e.free_symbols:
                    self.locate.setdefault(e, (i, None))
            elif isinstance(ex, torch.Tensor):
                exprs = [_expr(s) for s in ex.shape]
                self.arg_exprs.append(exprs)
                for d, s in enumerate(ex.shape):
                    if isinstance(s, torch.SymInt):
                        shape_env = shape_env or s.node.shape_env
                        e = _expr(s)
                        if _is_dyn(s) and e in e.free_symbols:
                            self.locate.setdefault(e, (i, d))
            else:
                self.arg_exprs.append(None)
        symbols = set()
        for e in self.arg_exprs:
            for x in (e if isinstance(e, list) else [e]):
                symbols |= set(getattr(x, "free_symbols", ()) or ())
        missing = symbols - set(self.locate)
        if missing or shape_env is None:
            raise Unsupported(f"symbols {sorted(map(str, missing))} are not an input's size")
        self.symbols = sorted(symbols, key=str)
        ranges, hints = {}, {}
        for s in self.symbols:
            vr = shape_env.var_to_range.get(s)
            lower = int(vr.lower) if vr is not None and vr.lower is not None else 2
            upper = None if vr is None or vr.upper in (int_oo, math.inf) or vr.upper.is_infinite else int(vr.upper)
            values = shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val
            ranges[s], hints[s] = (lower, upper), int(values[s])
        self.buckets = make_buckets(self.symbols, ranges, hints, options.get("num_dynamic_buckets", 1),
                                    options.get("bucket_size", 128))
        for ups in self.buckets.uppers:  # e.g. a reshape's divisibility guard the bound would break
            for g in shape_env.guards:
                ok = g.expr.xreplace({s: ups[s] for s in self.symbols})
                if ok is not True and not bool(ok):
                    raise Unsupported(f"bucket bound {ups} breaks the guard {g.expr}")
        # Dynamo recompiles outside the buckets, as TorchTPU's bound checks make it
        for s in self.symbols:
            sym = example_inputs[self.locate[s][0]]
            sym = sym if self.locate[s][1] is None else sym.shape[self.locate[s][1]]
            torch._check(sym >= self.buckets.lower[s])
            torch._check(sym <= self.buckets.uppers[-1][s])
        out = next(n for n in gm.graph.nodes if n.op == "output")
        leaves = pytree.tree_leaves(torch.fx.node.map_arg(out.args[0], lambda a: a.meta.get("val")))
        self.out_exprs = [[_expr(s) for s in v.shape] if isinstance(v, torch.Tensor)
                          else _expr(v) if isinstance(v, torch.SymInt) else None for v in leaves]
        self.sizes: dict[Any, Any] = {}  # the traced real sizes while the program is traced
        self.programs: set[int] = set()  # buckets used so far

    def env(self) -> dict[Any, Any]:
        return self.sizes

    def wrap_node(self, node: torch.fx.Node, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A node's lowering with real sizes for its size values and masks on its inputs' padded positions."""
        if node in self.plan.values:
            fn = real_values(fn, node, self.plan.values[node], self.env)
        if node in self.plan.masks:
            fn = masked(fn, node, self.plan.masks[node], self.env)
        return fn

    def wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """The program: real sizes first (traced: any size in the bucket reuses it), then the graph's inputs."""

        def program(sizes: Any, *args: Any) -> Any:
            self.sizes = {s: sizes[i] for i, s in enumerate(self.symbols)}
            try:
                return run(*args)
            finally:
                self.sizes = {}

        return program

    def pad(self, jargs: list[Any]) -> tuple[list[Any], Any, dict[Any, int]]:
        import jax.numpy as jnp

        values = {}
        for s, (i, d) in self.locate.items():
            values[s] = int(jargs[i]) if d is None else int(jargs[i].shape[d])
        b = self.buckets.index(values)
        self.programs.add(b)
        ups = self.buckets.uppers[b]
        out = []
        for a, e in zip(jargs, self.arg_exprs, strict=True):
            if isinstance(e, list) and any(_is_dyn(x) for x in e):
                target = [evaluate(x, ups) for x in e]
                a = jnp.pad(a, [(0, t - n) for t, n in zip(target, a.shape, strict=True)])
            elif e is not None and not isinstance(e, list) and _is_dyn(e):
                a = evaluate(e, ups)
            out.append(a)
        return out, jnp.array([values[s] for s in self.symbols], jnp.int32), (values, ups)

    def unpad(self, leaves: list[Any], call: tuple[dict[Any, int], dict[Any, int]]) -> list[Any]:
        values, ups = call
        res = []
        for i, (x, e) in enumerate(zip(leaves, self.out_exprs + [None] * (len(leaves) - len(self.out_exprs)),
                                       strict=False)):
            if i in self.plan.out_factors and hasattr(x, "shape"):
                x = _unpad_factored(x, self.plan.out_factors[i], values, ups)
            elif isinstance(e, list) and any(_is_dyn(s) for s in e) and hasattr(x, "shape"):
                x = x[tuple(slice(0, evaluate(s, values)) for s in e)]
            elif e is not None and not isinstance(e, list) and _is_dyn(e):
                x = evaluate(e, values)
            res.append(x)
        return res


def _unpad_factored(x: Any, factors: Factors, values: dict[Any, int], ups: dict[Any, int]) -> Any:
    """A padded output whose dimensions are made of factors (a batch merged with the sequence): split each
    dimension into its factors at the bucket's bound, slice the dynamic ones to the real sizes, merge back."""
    split = [evaluate(f, ups) for dim in factors for f in (dim or (1,))]
    x = x.reshape(split)
    x = x[tuple(slice(0, evaluate(f, values)) for dim in factors for f in (dim or (1,)))]
    return x.reshape([math.prod((evaluate(f, values) for f in dim), start=1) for dim in factors])
