"""ATen op -> JAX function on arrays: torchax's lowerings first, a few of our own where it has none.

Used by both modes: eager dispatch (dispatch.py) calls these on concrete arrays, the compiler
(compile.py) calls them on tracers inside one `jax.jit`.

Our own lowerings override or extend torchax's. Each is registered where it is written with
`@op_registry.lowers(op, ...)` (here, lowering_ops.py, lowering_parity.py, optim_lowerings.py, float8.py) and
says why in its docstring; `python -m hf_tpu.op_table` lists every op with where its lowering comes from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# lowering_ops, optim_lowerings, float8 and random_ops register their hand lowerings (op_registry) when imported
from hf_tpu import dtypes, float8, lowering_ops, op_registry, optim_lowerings, precision, random_ops  # noqa: F401
from hf_tpu.errors import NoLowering, op_name  # noqa: F401 - re-exported: callers name lowering.NoLowering
from hf_tpu import batch_norm, ctc_loss, fractional_pool, half_kernels, half_steps, histogram, pool_ties, segment_reduce, topk_ties  # noqa: F401  (register lowerings)
from hf_tpu import cumulative, linalg_lowerings, margin_loss, scatter_ops, special_functions, special_polynomials, unpool  # noqa: F401
from hf_tpu import torch_dot_ffi
from hf_tpu.lowering_parity import OPMATH, opmath
from hf_tpu.op_registry import lowers
from hf_tpu.rng import ENV
from hf_tpu.torchax_compat import load_op_table

aten = torch.ops.aten


@lowers(aten.as_strided.default)
def _as_strided(x: Any, size: list[int], stride: list[int], storage_offset: int | None = None) -> Any:
    """The functional form, for compiled graphs (eager keeps aliasing in tensor.py): views.read_step (regular
    ops, or a device-side gather)."""
    from hf_tpu import views

    step = (tuple(size), tuple(stride), int(storage_offset or 0))
    views.check_bounds(*step, x.size)
    return views.read_step(x.reshape(-1), step)


@lowers(aten.zero.default)  # zeros_like: PyTorch's decomposition of zero_ calls zeros_like, which calls zero_
def _zero(x: Any) -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy.zeros_like(x)


@lowers(aten._to_copy.default)
def _to_copy(x: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    """A dtype conversion only (the device move is the composite's), float8 rounded as CPU rounds it."""
    return x if dtype is None else float8.cast(x, dtypes.to_jax(dtype))


@lowers(torch.ops.prims.convert_element_type.default)
def _convert_element_type(x: Any, dtype: torch.dtype) -> Any:
    """PyTorch's references (torch._refs, the decompositions compiled graphs use for ops with no lowering, such
    as renorm on half inputs) convert dtypes with this prim: the same conversion as _to_copy."""
    return float8.cast(x, dtypes.to_jax(dtype))


@lowers(aten._grouped_mm.default)
def _grouped_mm(a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: torch.dtype | None = None) -> Any:
    """torch._grouped_mm (MoE experts; Transformers uses it on tpu for every dtype). JAX's ragged_dot is the
    grouped matmul for the forward case (2D tokens x 3D experts); the other layouts PyTorch documents are
    written with masks. `offs[i]` ends group i; rows (columns) past offs[-1] are zero."""
    from hf_tpu import runtime

    jax = runtime.jax()
    jnp = jax.numpy
    a, b = precision.round_args("mm", (a, b), precision.current())
    want = dtypes.to_jax(out_dtype) if out_dtype is not None else a.dtype
    if offs is None:
        if a.ndim != 3 or b.ndim != 3:
            raise ValueError(f"_grouped_mm without offs needs 3D operands, got {a.ndim}D and {b.ndim}D")
        out = jnp.matmul(a, b, preferred_element_type=jnp.float32)
    else:
        ends = offs.astype(jnp.int32)
        starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
        if a.ndim == 2 and b.ndim == 3:
            sizes = ends - starts
            out = jax.lax.ragged_dot(a, b, sizes, preferred_element_type=jnp.float32)
            rows = jnp.arange(a.shape[0])
            out = jnp.where((rows < ends[-1])[:, None], out, 0)
        elif a.ndim == 2 and b.ndim == 2:  # groups split k: out[g] = a[:, s:e] @ b[s:e]
            k = jnp.arange(a.shape[1])
            mask = ((k >= starts[:, None]) & (k < ends[:, None])).astype(a.dtype)
            out = jnp.einsum("mk,gk,kn->gmn", a, mask, b, preferred_element_type=jnp.float32)
        elif a.ndim == 3 and b.ndim == 2:  # groups split n: out[:, s:e] = a[g] @ b[:, s:e]
            full = jnp.einsum("gmk,kn->gmn", a, b, preferred_element_type=jnp.float32)
            n = jnp.arange(b.shape[1])
            group = jnp.clip(jnp.searchsorted(ends, n, side="right"), 0, a.shape[0] - 1)
            out = jnp.take_along_axis(full, group[None, None, :], axis=0)[0]
            out = jnp.where((n < ends[-1])[None, :], out, 0)
        else:
            raise ValueError(f"_grouped_mm with offs needs 2D/3D operands, got {a.ndim}D and {b.ndim}D")
    if bias is not None:
        out = out + bias
    return out.astype(want)


@lowers(aten._index_put_impl.default)
def _index_put_impl(x: Any, indices: Any, values: Any, accumulate: bool = False, unsafe: bool = False) -> Any:
    """The functional form of `_index_put_impl_`, which the backward of `x[idx]` calls (accumulate=True, e.g.
    GPT2ForSequenceClassification's pooled logits). It is index_put plus `unsafe`, which only skips PyTorch's
    bounds checks, so torchax's index_put lowering is the whole job."""
    return find(aten.index_put.default)(x, indices, values, accumulate)


@lowers(aten.view.dtype)
def view_dtype(x: Any, dtype: torch.dtype) -> Any:
    """`x.view(dtype)`: the same bytes read as `dtype`; a wider or narrower dtype scales the last dim, as in
    PyTorch."""
    from hf_tpu import runtime

    jax = runtime.jax()
    jnp = jax.numpy
    want = jnp.dtype(dtypes.to_jax(dtype))
    if x.dtype == want:
        return x
    if want == jnp.bool_:  # XLA does not bitcast to pred; PyTorch's bool is one byte
        return view_dtype(x, torch.uint8) != 0
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    a, b = x.dtype.itemsize, want.itemsize
    if a == b:
        return jax.lax.bitcast_convert_type(x, want)
    if x.ndim == 0 or (b > a and x.shape[-1] % (b // a)):
        raise RuntimeError(f"self.size(-1) must be divisible by {b // a} to view {x.dtype} as {dtype} "
                           f"(different element sizes), but got {x.shape[-1] if x.ndim else 'a 0-dim tensor'}")
    if a > b:  # each element becomes a // b narrower ones, in a new last axis
        out = jax.lax.bitcast_convert_type(x, want)
        return out.reshape(*x.shape[:-1], x.shape[-1] * (a // b))
    r = b // a
    return jax.lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // r, r), want)


@lowers(aten.linalg_cholesky_ex.default)
def _cholesky_ex(a: Any, upper: bool = False, check_errors: bool = False) -> Any:
    """(L, info) as torch.linalg.cholesky_ex: info is 0, or k when the leading k x k minor is the first that is
    not positive definite (LAPACK's potrf). XLA's Cholesky only fills L with NaN on failure, so info comes from
    the pivots of an unpivoted elimination (n rank-1 updates; hand-written because no JAX API reports it)."""
    from hf_tpu import runtime

    jax = runtime.jax()
    jnp = jax.numpy
    if check_errors:  # PyTorch raises LinAlgError on a bad info; that needs the value on the host
        raise NotImplementedError("hf_tpu: linalg_cholesky_ex(check_errors=True) on tpu; use check_errors=False")
    n = a.shape[-1]
    lower = jnp.linalg.cholesky(a if not upper else jnp.swapaxes(a, -1, -2).conj())
    idx = jnp.arange(n)

    def step(k: Any, state: tuple[Any, Any]) -> tuple[Any, Any]:
        m, info = state
        d = m[..., k, k].real
        bad = ~(d > 0)  # NaN pivots too
        info = jnp.where((info == 0) & bad, k + 1, info)
        col = m[..., :, k] / jnp.where(bad, 1, d)[..., None]
        rest = (idx > k)[:, None] & (idx > k)[None, :]
        return m - jnp.where(rest, col[..., :, None] * m[..., k, None, :], 0), info

    _, info = jax.lax.fori_loop(0, n, step, (a, jnp.zeros(a.shape[:-2], jnp.int32)))
    # rounding may let the pivots pass where XLA's factorisation did not: still a failure
    finite = jnp.isfinite(lower).all(axis=(-2, -1))
    info = jnp.where((info == 0) & ~finite, n, info).astype(jnp.int32)
    return (jnp.swapaxes(lower, -1, -2).conj() if upper else lower), info


@lowers(aten.convolution.default)
def _convolution(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                 output_padding: Any, groups: int) -> Any:
    """torchax's convolution, with the weight of a grouped transposed convolution rearranged first: torchax
    reshapes [C_in, C_out/g, k..] straight to [C_in/g, C_out, k..], mixing groups (conv_transpose with
    groups > 1 gave wrong values, and so did its gradients); the right layout puts each group's C_out/g
    output channels side by side, which this transpose does before torchax's reshape."""
    table = load_op_table()[0]
    entry = table.get(aten.convolution.default) or table[aten.convolution]
    if transposed and groups != 1:
        g = int(groups)
        cin, cout_g, *k = weight.shape
        w = weight.reshape(g, cin // g, cout_g, *k).swapaxes(0, 1)
        weight = w.reshape(cin, cout_g, *k)
    return entry.func(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowers(aten.diagonal_scatter.default)
def _diagonal_scatter(x: Any, src: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """torchax's, with negative dims made positive first: it rejects them ("dim1 and dim2 must be different and
    in range"), and diagonal_backward passes dim1=-2, dim2=-1 (torch.linalg.diagonal's gradient raised)."""
    table = load_op_table()[0]
    entry = table.get(aten.diagonal_scatter.default) or table[aten.diagonal_scatter]
    n = max(x.ndim, 1)
    return entry.func(x, src, offset, dim1 % n, dim2 % n)


@lowers(aten.slice_scatter.default)
def _slice_scatter(x: Any, src: Any, dim: int = 0, start: int | None = None, end: int | None = None,
                   step: int = 1) -> Any:
    """torchax's, with a negative dim made positive first: it compares dim with each axis, so dim=-1 wrote
    nothing ("Incompatible types for broadcasting"; slice_backward of x.narrow(-1, ...) raised)."""
    table = load_op_table()[0]
    entry = table.get(aten.slice_scatter.default) or table[aten.slice_scatter]
    return entry.func(x, src, dim % max(x.ndim, 1), start, end, step)


def _upsample_aa(method: str) -> Callable[..., Any]:
    """_upsample_{bilinear,bicubic}2d_aa (antialiased resize) through jax.image.scale_and_translate, the public
    API: torchax 0.0.13's lowering calls a private JAX table whose entries are no longer callables ('tuple'
    object is not callable). Half-pixel centres and a filter widened when downsampling, as PyTorch's
    antialias=True (PIL's rule); its bicubic aa uses Keys' a=-0.5, as JAX's "cubic"."""

    def upsample(x: Any, output_size: Any, align_corners: bool, scales_h: float | None = None,
                 scales_w: float | None = None) -> Any:
        from hf_tpu import runtime

        jax = runtime.jax()
        jnp = jax.numpy
        dims = (x.ndim - 2, x.ndim - 1)
        shape = list(x.shape)
        shape[-2], shape[-1] = int(output_size[-2]), int(output_size[-1])
        if shape == list(x.shape):
            return x
        if align_corners:
            scale = [(shape[d] - 1.0) / max(x.shape[d] - 1.0, 1.0) for d in dims]
        else:
            scale = [float(s) if s else shape[d] / x.shape[d] for s, d in zip((scales_h, scales_w), dims, strict=True)]
        out = jax.image.scale_and_translate(x, shape, dims, jnp.array(scale, jnp.float32),
                                            jnp.zeros((2,), jnp.float32), method, antialias=True)
        return out.astype(x.dtype)

    return upsample


lowers(aten._upsample_bilinear2d_aa.default)(_upsample_aa("linear"))
lowers(aten._upsample_bicubic2d_aa.default)(_upsample_aa("cubic"))
# 0 is the math kernel: SDPA decomposes into matmuls that honour tpu precision
lowers(aten._fused_sdp_choice.default)(lambda *a, **k: 0)
lowers(aten.alias.default, aten.lift_fresh.default)(lambda x: x)

# Our lowerings (here, lowering_ops.py, lowering_parity.py, optim_lowerings.py, float8.py), by op.
_HAND = op_registry.table("jax")


@functools.cache
def find(op: Any) -> Callable[..., Any] | None:
    """The JAX function for `op` (an OpOverload), or None."""
    fn = _HAND.get(op)
    if fn is None:
        lowerings, _ = load_op_table()
        entry = lowerings.get(op) or lowerings.get(getattr(op, "overloadpacket", None))
        if entry is None:
            if op in OPMATH and decomposition(op) is not None:  # traced in float32 rather than left to dispatch
                from hf_tpu import decomposed

                return opmath(decomposed.as_lowering(op, decomposition(op)))
            return None
        fn = entry.func
        if isinstance(op, torch._ops.OpOverload) and not _accepts_schema(fn, op):
            return None  # written for another torch's schema: the decomposition is right instead
        fn = _adapt_kwargs(fn, op)
        if fn is None:
            return None
        if op in _CAST_INPUT_FIRST:
            fn = _cast_input_first(fn, op)
        if entry.needs_env:
            fn = functools.partial(fn, env=ENV)
    if op in OPMATH:
        fn = opmath(fn)
    elif torch.Tag.pointwise in getattr(op, "tags", ()) and op not in op_registry.flagged("half_as_written"):
        # CPU's vectorised half kernels evaluate in float32
        fn = opmath(fn, pointwise=op._schema)
    name = op.__name__.split(".")[0] if hasattr(op, "__name__") else ""
    if name in precision.MATMUL_OPERANDS:
        inner = fn

        def fn(*args: Any, **kwargs: Any) -> Any:  # noqa: F811 - the precision-aware variant
            prec = precision.current()
            if name in torch_dot_ffi.OPS:  # large float dots: PyTorch's CPU matmul inside the program
                out = torch_dot_ffi.lowered(name, args, kwargs, prec)
                if out is not None:
                    return out
            args = precision.round_args(name, args, prec)
            if name in precision.WIDE_ACCUMULATION_OPS:  # bfloat16 operands: YNNPACK's bfloat16 dot
                out = precision.wide_accumulation_matmul(name, args, kwargs)
                if out is not None:
                    return out
            return inner(*args, **kwargs)

    return fn


# Reductions whose torchax lowering takes `dtype` (softmax: `half_to_float`) but reduces in the input's dtype
# and casts after (softmax ignores it): sum(x_fp16, dtype=float32) accumulated in float16. PyTorch casts the
# input first, and autocast relies on it (softmax, log_softmax, sum, norm run with dtype=float32 there).
_CAST_INPUT_FIRST = op_registry.mark("cast_input_first", {
    aten.sum.default, aten.sum.dim_IntList, aten.softmax.int, aten.log_softmax.int, aten._softmax.default,
    aten._log_softmax.default, aten.linalg_vector_norm.default, aten.cumsum.default, aten.cumprod.default,
    aten.prod.default, aten.prod.dim_int})


def _cast_input_first(fn: Callable[..., Any], op: Any) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    flag = "dtype" if "dtype" in names else "half_to_float"
    where = names.index(flag)

    @functools.wraps(fn)
    def lowered(*args: Any, **kwargs: Any) -> Any:
        if where < len(args):
            want, args = args[where], (*args[:where], None if flag == "dtype" else False, *args[where + 1:])
        else:
            want = kwargs.pop(flag, None)
        if flag == "half_to_float":
            want = torch.float32 if want else None
        if want is not None:
            args = (args[0].astype(dtypes.to_jax(want)), *args[1:])
        return fn(*args, **kwargs)

    return lowered


def _accepts_schema(fn: Callable[..., Any], op: Any) -> bool:
    """Can `fn` take this overload's arguments? torchax 0.0.13 predates some torch 2.13 schemas
    (e.g. native_layer_norm_backward gained arguments); such lowerings would fail at run time."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    # the arguments every caller passes: positional ones without a default
    required = [None] * sum(1 for a in op._schema.arguments if not a.kwarg_only and not a.has_default_value())
    try:
        sig.bind(*required)
    except TypeError:
        return False
    return True


# Keyword-only schema arguments that do not change the values an op computes (on tpu): dropped.
_VALUE_FREE_KWARGS = {"implicit", "layout", "device", "pin_memory", "output_size", "check_errors",
                      "memory_format", "sparse_grad"}
_DTYPE_KWARGS = {"dtype", "output_dtype"}


def _adapt_kwargs(fn: Callable[..., Any], op: Any) -> Callable[..., Any] | None:
    """`fn` made to take the keyword-only arguments of this overload's schema that it has no parameter for
    (torchax 0.0.13's lowerings predate torch 2.13's schemas, e.g. `mean.dim(..., *, dtype)`), instead of
    failing with "unexpected keyword argument". `dtype` is honoured as PyTorch does: the input is cast
    first (reductions), or, for an op without an array input, the result; value-free arguments
    (`layout`, `implicit`, ...) are dropped, and so is any other at its schema default. Any other
    value raises a NotImplementedError naming the op and the argument. None: `fn` was not written for
    this overload (the decomposition is right instead)."""
    import inspect

    if not isinstance(op, torch._ops.OpOverload):
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn
    missing = {a.name: a for a in op._schema.arguments if a.kwarg_only and a.name not in params
               and not (a.alias_info is not None and a.alias_info.is_write)}  # out= is dispatch's job
    if not missing:
        return fn
    if "device" in missing:
        return None  # a factory overload under a lowering written for the packet's tensor overload
    name = op_name(op)

    @functools.wraps(fn)
    def adapted(*args: Any, **kwargs: Any) -> Any:
        cast = None
        for k in [k for k in kwargs if k in missing]:
            v = kwargs.pop(k)
            if k in _DTYPE_KWARGS:
                cast = v
            elif k not in _VALUE_FREE_KWARGS and v is not None and v != missing[k].default_value:
                raise NotImplementedError(f"hf_tpu: the JAX lowering of {name} does not support {k}={v!r}")
        if cast is None:
            return fn(*args, **kwargs)
        want = dtypes.to_jax(cast)
        if args and hasattr(args[0], "astype") and hasattr(args[0], "shape"):
            return fn(args[0].astype(want), *args[1:], **kwargs)
        out = fn(*args, **kwargs)
        return out.astype(want) if hasattr(out, "astype") else out

    return adapted


@functools.cache
def is_random(op: Any) -> bool:
    """Draws random numbers (its JAX key must advance on every call, so it is never cached as a program)."""
    if op in random_ops.RANDOM:
        return True
    lowerings, _ = load_op_table()
    entry = lowerings.get(op) or lowerings.get(getattr(op, "overloadpacket", None))
    return bool(entry is not None and entry.needs_env)


@functools.cache
def decomposition(op: Any) -> Callable[..., Any] | None:
    """A pure-torch decomposition of `op` (torchax's, then PyTorch's), run on tpu tensors."""
    _, decomps = load_op_table()
    fn = decomps.get(op) or decomps.get(getattr(op, "overloadpacket", None))
    if fn is None:
        from torch._decomp import decomposition_table

        fn = decomposition_table.get(op)
    return fn
