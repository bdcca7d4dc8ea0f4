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
size evaluated at the call's actual values, passed into the program as a traced argument).

The sizes and buckets are bounded_sizes.py's, the plan of which ops get masks bounded_plan.py's; this module
masks inside the program and runs a graph padded."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hf_tpu.bounded_plan import Mask, graph_plan
from hf_tpu.bounded_sizes import Factors
from hf_tpu.bounded_sizes import Unsupported, dyn_dims, evaluate, expr, is_dyn, make_buckets


log = logging.getLogger(__name__)


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
            k = next(i for i, x in enumerate(f) if is_dyn(x))
            inner = math.prod(int(x) for x in f[k + 1:])
            padded_dyn = padded_shape[d] // math.prod(int(x) for x in f if not is_dyn(x))
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
            args[i] = evaluate(expr(node.args[i].meta["val"]), env())
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
            exprs = [expr(s) for s in node.args[pos].meta["val"].shape]
            fac = {d: f for (p, d), f in spec.factors.items() if p == pos}
            args[pos] = jnp.where(_real(exprs, x.shape, dims, sizes, fac), x, _fill_value(fill, x.dtype))
        out = fn(*args, **kwargs)
        if spec.rescale:
            x = args[0]
            exprs = [expr(s) for s in node.args[0].meta["val"].shape]
            padded = math.prod(x.shape[d] for d in spec.rescale)
            real = math.prod((evaluate(exprs[d], sizes) for d in spec.rescale), start=1)
            out = out * (padded / real).astype(out.dtype)
        return out

    return call


def padded_last_sort(node: torch.fx.Node, dim: int, factors: tuple[Any, ...],
                     env: Callable[[], dict[Any, Any]]) -> Callable[..., Any]:
    """An ascending sort along a dynamic dimension with its padded positions last (bounded_plan's sort rule):
    the padded flag is the first key, the stable sort keeps the real elements' order, so the real prefix
    holds the sort of the real elements and the indices their (padded layout's) positions."""

    def call(a: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        exprs = [expr(s) for s in node.args[0].meta["val"].shape]
        padded = ~jnp.broadcast_to(_real(exprs, a.shape, [dim], env(), {dim: factors}), a.shape)
        iota = jax.lax.broadcasted_iota(jnp.int64, a.shape, dim)
        _, values, indices = jax.lax.sort((padded.astype(jnp.int8), a, iota), dimension=dim, is_stable=True,
                                          num_keys=2)
        return values, indices

    return call


# ----------------------------------------------------------------------------------- a graph's padded run


def has_dynamic_sizes(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph's inputs (tensors and SymInts) have a dynamic size: else it is compiled as it is."""
    return any(isinstance(ex, torch.SymInt) and is_dyn(ex) for ex in example_inputs) or any(
        isinstance(ex, torch.Tensor) and dyn_dims(ex) for ex in example_inputs)


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
                e = expr(ex)
                self.arg_exprs.append(e)
                shape_env = shape_env or ex.node.shape_env
                if is_dyn(ex) and len(e.free_symbols) == 1 and e in e.free_symbols:
                    self.locate.setdefault(e, (i, None))
            elif isinstance(ex, torch.Tensor):
                exprs = [expr(s) for s in ex.shape]
                self.arg_exprs.append(exprs)
                for d, s in enumerate(ex.shape):
                    if isinstance(s, torch.SymInt):
                        shape_env = shape_env or s.node.shape_env
                        e = expr(s)
                        if is_dyn(s) and e in e.free_symbols:
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
        values = shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val
        for s in self.symbols:
            vr = shape_env.var_to_range.get(s)
            lower = int(vr.lower) if vr is not None and vr.lower is not None else 2
            upper = None if vr is None or vr.upper in (int_oo, math.inf) or vr.upper.is_infinite else int(vr.upper)
            ranges[s], hints[s] = (lower, upper), int(values[s])
        self.buckets = make_buckets(self.symbols, ranges, hints, options.get("num_dynamic_buckets", 1),
                                    options.get("bucket_size", 128))
        # e.g. a reshape's divisibility guard the bound would break. Only guards on this graph's sizes: the
        # frame's shape env also holds guards its other graphs added on sizes this graph does not take (Xmod,
        # after 20 breaks: Eq(s87, s28) with s87 another graph's length), which its program cannot depend on
        for ups in self.buckets.uppers:
            for g in shape_env.guards:
                if not g.expr.free_symbols <= set(self.symbols):
                    continue
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
        self.out_exprs = [[expr(s) for s in v.shape] if isinstance(v, torch.Tensor)
                          else expr(v) if isinstance(v, torch.SymInt) else None for v in leaves]
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
        if node in self.plan.sorts:
            fn = padded_last_sort(node, *self.plan.sorts[node], self.env)
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
            if isinstance(e, list) and any(is_dyn(x) for x in e):
                target = [evaluate(x, ups) for x in e]
                a = jnp.pad(a, [(0, t - n) for t, n in zip(target, a.shape, strict=True)])
            elif e is not None and not isinstance(e, list) and is_dyn(e):
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
            elif isinstance(e, list) and any(is_dyn(s) for s in e) and hasattr(x, "shape"):
                x = x[tuple(slice(0, evaluate(s, values)) for s in e)]
            elif e is not None and not isinstance(e, list) and is_dyn(e):
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
