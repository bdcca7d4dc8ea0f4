"""Eager mode: the PrivateUse1 fallback that runs every ATen op reaching a `tpu` tensor through JAX.

One Python function serves all ops (PyTorch's pure-Python backend pattern). It sorts each op by its
schema: factories and copies, views (aliasing kept in tensor.py), in-place ops and `out=` variants
(computed functionally, then written back), and functional ops (lowering.py). Ops are asynchronous, as
JAX is; TORCH_TPU_LAUNCH_BLOCKING=1 (or TPU_LAUNCH_BLOCKING=1) waits for each op so errors surface at
the op that caused them.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import (backward_lowerings, decomposed, dtypes, float8, fused, lowering, op_jit, optim_lowerings, plans,
                    precision, serialization)
from hf_tpu import tensor as T
from hf_tpu.errors import TpuOpError  # noqa: F401 - re-exported: callers catch dispatch.TpuOpError

aten = torch.ops.aten
_fallback_counts: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()


def launch_blocking() -> bool:
    # A module global, not os.environ: it is consulted on every op, and environment lookups showed up in
    # profiles. Read from TORCH_TPU_LAUNCH_BLOCKING at import, switched by torch.tpu.set_eager_mode.
    return fused.LAUNCH_BLOCKING


def cpu_fallback_enabled() -> bool:
    return os.environ.get("HF_TPU_CPU_FALLBACK", "0") == "1"


def fallback_ops() -> dict[str, int]:
    """Ops that ran on the CPU fallback since the last reset, with how often."""
    with _lock:
        return dict(_fallback_counts)


def reset_fallback_ops() -> None:
    with _lock:
        _fallback_counts.clear()


# ---------------------------------------------------------------------------------------------- devices
def check_device(device: Any) -> None:
    if device is None:
        return
    device = torch.device(device)
    if device.type == "tpu" and device.index not in (None, 0):
        raise RuntimeError(
            f"{device} is not a valid device: this machine has 1 tpu device (tpu:0). "
            "Use device='tpu' or 'tpu:0'."
        )


def _mixed_device_error(op: Any, other: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and "
        f"{other.device}! (when checking arguments for {lowering.op_name(op)})"
    )


# Ops that accept CPU index tensors next to device tensors, as CUDA does.
_CPU_INDEX_OK = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}


def _unwrap(op: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type == "tpu":
            return T.operand(x)  # a view stays geometry: the op's program reads it (op_jit)
        if x.dim() == 0 or op.__name__.split(".")[0] in _CPU_INDEX_OK:
            return T.from_cpu(x)  # a CPU scalar tensor acts as a scalar, as on CUDA
        raise _mixed_device_error(op, x)
    if isinstance(x, torch.device):
        check_device(x)
    return x


# ------------------------------------------------------------------------------------------ op kinds
@functools.cache
def _kind(op: Any) -> str:
    schema = op._schema
    if any(a.is_out for a in schema.arguments):
        return "out"
    args = schema.arguments
    if args and args[0].alias_info is not None and args[0].alias_info.is_write:
        return "inplace"
    rets = schema.returns
    if rets and rets[0].alias_info is not None and not rets[0].alias_info.is_write:
        return "view"
    return "functional"


@functools.cache
def _functional_of(op: Any) -> Any:
    """The functional op an in-place (`add_`) or out= (`add.out`) op computes."""
    packet = op.overloadpacket
    schema = op._schema
    if _kind(op) == "inplace":
        name = packet.__name__.rstrip("_")
        base = getattr(aten, name, None)
        if base is None:
            return None
        ov = schema.overload_name or "default"
        return getattr(base, ov) if ov in base.overloads() else base
    names = [a.name for a in schema.arguments if not a.is_out]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cargs = cand._schema.arguments
        if not any(a.is_out for a in cargs) and [a.name for a in cargs] == names:
            return cand
    # out= overloads often drop kwargs the functional lacks (e.g. dtype): match positionally
    pos = [a.name for a in schema.arguments if not a.is_out and not a.kwarg_only]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cargs = cand._schema.arguments
        if not any(a.is_out for a in cargs) and [a.name for a in cargs if not a.kwarg_only] == pos:
            return cand
    return None


# ------------------------------------------------------------------------------------- dtype fix-ups
_meta_cache: dict[Any, Any] = {}


def _leaves(args: tuple, kwargs: dict) -> list[Any]:
    # ATen arguments nest at most one level (Tensor[]): cheaper than a general pytree walk per op
    out: list[Any] = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, list | tuple):
            out.extend(x)
        else:
            out.append(x)
    return out


def _map(f: Callable[[Any], Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    def one(x: Any) -> Any:
        if isinstance(x, list | tuple):
            return type(x)(f(v) for v in x)
        return f(x)

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _meta_dtypes(op: Any, args: tuple, kwargs: dict) -> list[torch.dtype] | None:
    """The output dtypes PyTorch gives this op for these input dtypes (meta kernels, cached).

    torchax's lowerings sometimes return a different dtype than PyTorch (JAX promotion, x64 defaults);
    the result is cast to PyTorch's dtype so `.dtype` and the numbers agree with CPU."""
    key = (op, torch.get_default_dtype(),  # factories without a dtype (and float scalars) follow the default
           tuple((x.dtype, x.dim() == 0, x.device.type) if isinstance(x, torch.Tensor) else
                 (x if isinstance(x, (torch.dtype, bool)) else type(x)) for x in _leaves(args, kwargs)),
           tuple(kwargs))  # the names too: searchsorted(right=True) and (out_int32=True) differ in dtype
    try:
        return _meta_cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable leaf
        return None

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("meta")
        return x

    try:
        margs, mkwargs = _map(to_meta, args, kwargs)
        out = op(*margs, **mkwargs)
        result = [o.dtype if isinstance(o, torch.Tensor) else None for o in pytree.tree_leaves(out)]
    except Exception:
        result = None
    _meta_cache[key] = result
    return result


def _wrap_one(x: Any, dt: torch.dtype | None) -> torch.Tensor:
    if dt is not None:
        want = dtypes.to_jax(dt)
        if want != x.dtype:
            x = float8.cast(x, want)
    if launch_blocking():
        plans.block(x)
    return T.wrap(x, dt)


# Ops whose lowerings give CPU's output dtypes where PyTorch's meta kernels do not: batch norm's saved
# statistics are float32 by the meta kernel, but CPU keeps them in the parameters' dtype (bfloat16 input
# and parameters give bfloat16 statistics).
_LOWERING_DTYPES = frozenset({aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
                              aten._native_batch_norm_legit.no_stats,
                              aten._native_batch_norm_legit_functional.default})


def _wrap_outputs(op: Any, res: Any, args: tuple, kwargs: dict) -> Any:
    if op in _LOWERING_DTYPES:
        return pytree.tree_map(lambda x: _wrap_one(x, None) if plans.is_array(x) else x, res)
    if plans.is_array(res):  # the common case: one array
        expected = _meta_dtypes(op, args, kwargs)
        return _wrap_one(res, expected[0] if expected else None)
    leaves, spec = pytree.tree_flatten(res)
    if not any(plans.is_array(x) for x in leaves):
        return res  # a Python scalar or bool (.item(), is_nonzero, ...)
    expected = _meta_dtypes(op, args, kwargs)
    out = [
        _wrap_one(x, expected[i] if expected and i < len(expected) else None) if plans.is_array(x) else x
        for i, x in enumerate(leaves)
    ]
    return pytree.tree_unflatten(out, spec)


# --------------------------------------------------------------------------------------- functional
def _cpu_fallback(op: Any, args: tuple, kwargs: dict) -> Any:
    def to_cpu(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return T.to_cpu(T.value(x), x.dtype)
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        return x

    cargs, ckwargs = _map(to_cpu, args, kwargs)
    res = op(*cargs, **ckwargs)
    with _lock:
        _fallback_counts[lowering.op_name(op)] += 1
    return pytree.tree_map_only(torch.Tensor, lambda t: T.wrap(T.from_cpu(t), t.dtype), res)


# float8 operands these ops take as they are: conversions (which give CPU's bits themselves), bit views, and
# _scaled_mm (float8.py, which checks its operands are float8).
_FLOAT8_AS_IS = frozenset({aten._to_copy.default, aten.view.dtype, aten.clone.default, aten.alias.default,
                           aten.lift_fresh.default, aten._scaled_mm.default})


def _integral_promotion(op: Any, args: tuple, kwargs: dict) -> Any:
    """The JAX dtype to promote all inputs to first, or None. Integer or bool inputs of an op whose result
    PyTorch makes floating (sigmoid, rsqrt, true division) are promoted, as PyTorch does; JAX's float
    functions reject integer arrays."""
    tensors = [x for x in _leaves(args, kwargs) if isinstance(x, torch.Tensor)]
    if not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors):
        return None
    expected = _meta_dtypes(op, args, kwargs)
    if not expected or expected[0] is None or not expected[0].is_floating_point:
        return None
    return dtypes.to_jax(expected[0])


def eager_lowering(op: Any) -> Callable[..., Any] | None:
    """The JAX function eager mode runs `op` with: its lowering, or else its decomposition traced as one
    program (decomposed.py). Compiled mode decomposes in the graph instead (compile.py). `lowering.find` is
    looked up on every call, so a lowering replaced at run time (the canary's fault) is honoured."""
    fn = backward_lowerings.find(op) or lowering.find(op)
    # keyed by `lowering.find` too: a traced decomposition has its sub-ops' lowerings baked in, so a replaced
    # lowering (the canary's fault in bmm) must give SDPA's decomposition a new program
    return fn if fn is not None else _decomposed(op, lowering.find)


@functools.cache
def _decomposed(op: Any, find: Callable[[Any], Any]) -> Callable[..., Any] | None:
    if not decomposed.traceable(op):
        return None
    dec = lowering.decomposition(op)
    if dec is None and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        dec = op.decompose  # a composite sent to us whole (sdpa.py): PyTorch's own decomposition
    return None if dec is None else decomposed.as_lowering(op, dec)


def run_functional(op: Any, args: tuple, kwargs: dict) -> Any:
    key, arrays = plans.signature(op, args, kwargs)
    if key is not None:
        plan = plans.table.get(key)
        if plan is not None and plan.fn is eager_lowering(op):
            if fused.ACTIVE:
                try:
                    return plans.defer(plan, arrays, op)
                except Exception:  # shapes the program cannot take: the general path raises properly
                    pass
            try:
                return plans.run(plan, arrays, launch_blocking())
            except Exception:  # e.g. shapes the program cannot take: the general path raises properly
                pass
    res, plan = _run_functional(op, args, kwargs)
    if key is not None and plan is not None:
        plans.table[key] = plan
    return res


def _run_functional(op: Any, args: tuple, kwargs: dict) -> tuple[Any, plans.Plan | None]:
    """The general path: the result, and a Plan for repeating it when it is one array, or a flat tuple of
    arrays, from one program."""
    fn = eager_lowering(op)
    if fn is None:
        dec = lowering.decomposition(op)  # a factory's, run as it is (decomposed.traceable)
        if dec is not None:
            return dec(*args, **kwargs), None
        if cpu_fallback_enabled():
            return _cpu_fallback(op, args, kwargs), None
        raise lowering.NoLowering(op)
    jargs, jkwargs = _map(functools.partial(_unwrap, op), args, kwargs)
    promote_to = _integral_promotion(op, args, kwargs)
    plannable = True
    if promote_to is not None:
        # views are read here, so the program takes their values; a plan (keyed by view geometry, fed the
        # buffers) would hand it the buffers instead
        plannable = not any(type(x) is T.Operand for x in _leaves(jargs, jkwargs))
        jargs, jkwargs = op_jit.materialise(jargs, jkwargs)
        jargs, jkwargs = _map(lambda x: x.astype(promote_to) if plans.is_array(x) else x, jargs, jkwargs)
    narrow_to = None
    if promote_to is None and op not in _FLOAT8_AS_IS:
        narrow_to = next((x.dtype for x in _leaves(args, kwargs)
                          if isinstance(x, torch.Tensor) and x.dtype in float8.DTYPES), None)
    if narrow_to is not None:
        # CPU computes float8 ops in float32 and rounds once (float8.py); the outputs are cast back to PyTorch's
        # dtypes by _wrap_outputs. Not planned: a plan would hand the program the float8 buffers.
        plannable = False
        jargs, jkwargs = op_jit.materialise(jargs, jkwargs)
        jargs, jkwargs = _map(float8.widen, jargs, jkwargs)
    try:
        res, program = op_jit.call_with_program(op, fn, jargs, jkwargs, precision.current(),
                                                not lowering.is_random(op))
        if narrow_to is not None and _meta_dtypes(op, args, kwargs) is None:  # data-dependent shapes
            want = dtypes.to_jax(narrow_to)
            res = pytree.tree_map(lambda r: float8.cast(r, want) if plans.is_array(r) and r.dtype.name == "float32"
                                  else r, res)
    except (NotImplementedError, lowering.NoLowering):
        raise
    except Exception as exc:
        if cpu_fallback_enabled():
            return _cpu_fallback(op, args, kwargs), None
        raise TpuOpError(op, exc) from exc
    if res is NotImplemented:  # torchax declines some argument combinations
        if cpu_fallback_enabled():
            return _cpu_fallback(op, args, kwargs), None
        raise lowering.NoLowering(op, " for these arguments")
    out = _wrap_outputs(op, res, args, kwargs)
    plan = plans.make(fn, program, promote_to, res, out) if program is not None and plannable else None
    return out, plan


# ----------------------------------------------------------------------------------- special cases
def _zeros(size: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """`empty`: zeros made only if something reads them before a write replaces them (`to("tpu")` is an
    `empty` then a `copy_`, so a move never allocates the zeros)."""
    from hf_tpu import runtime

    dtype = dtypes.check(dtype or torch.get_default_dtype())
    shape = tuple(int(s) for s in size)
    jdt = dtypes.to_jax(dtype)
    return T.wrap_lazy(shape, dtype, lambda: float8.zeros(shape, jdt))


def _empty(size: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> torch.Tensor:
    check_device(device)
    return _zeros(size, dtype)


def _empty_strided(size: Any, stride: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> torch.Tensor:
    check_device(device)
    return _zeros(size, dtype)


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if dst.device.type == "tpu":
        if src.device.type == "tpu":
            if not (fused.ACTIVE and T.defer_write(dst, src)):
                T.assign(dst, T.value(src))
        else:
            T.assign(dst, T.from_cpu(src))
        return dst
    T.copy_to_cpu(T.value(src), src.dtype, dst)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        if dst.device.type == "tpu":
            T.replace(dst, T.value(src) if src.device.type == "tpu" else T.from_cpu(src))
            return dst
        dst.resize_(src.shape)
    return _copy_from(src, dst)


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


def _view(src: torch.Tensor, size: Any) -> torch.Tensor:
    return T.view_reshape(src, _infer_size(size, src.numel()))


def _as_strided(src: torch.Tensor, size: Any, stride: Any, storage_offset: Any = None) -> torch.Tensor:
    return T.make_view(src, [int(s) for s in size], [int(s) for s in stride], int(storage_offset or 0))


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


def _generic_view(op: Any, args: tuple, kwargs: dict) -> torch.Tensor | list[torch.Tensor]:
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
    return [T.view_of(p.buf, size, src.dtype, view, src) for size, view in made]


def _off_device_factory(op: Any, args: tuple, kwargs: dict) -> Any:
    """`empty_like(x, device="meta")`, `x.new_zeros(..., device="cpu")` and the like on a tpu `x`: only
    x's shape and dtype matter, so the op runs on a meta stand-in for x and makes its result where asked."""
    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        return x

    margs, mkwargs = _map(meta, args, kwargs)
    return op(*margs, **mkwargs)


@functools.cache
def _is_like_factory(op: Any) -> bool:
    name = op.__name__.split(".")[0]
    return (name.endswith("_like") or name.startswith("new_")) and any(
        a.name == "device" for a in op._schema.arguments)


def _resize_(t: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    size = [int(s) for s in size]
    if list(t.shape) == size:
        return t
    from hf_tpu import runtime

    jnp = runtime.jax().numpy
    old = T.value(t).reshape(-1)
    n = 1
    for s in size:
        n *= s
    flat = jnp.zeros((n,), old.dtype).at[: min(n, old.size)].set(old[: min(n, old.size)])
    T.replace(t, flat.reshape(size))
    return t


def _set_source_tensor(t: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    t.data = src  # shares src's StorageImpl, hence its payload
    return t


def _view_as_real(src: torch.Tensor) -> torch.Tensor:
    # A view that reinterprets dtype cannot be an index into the same buffer: tpu gives a copy. In-place
    # writes through it do not reach the complex tensor (rare: FFT-based models only read it).
    jnp = T._jnp()
    v = T.value(src)
    return T.wrap(jnp.stack([jnp.real(v), jnp.imag(v)], axis=-1))


def _view_as_complex(src: torch.Tensor) -> torch.Tensor:
    v = T.value(src)
    return T.wrap(v[..., 0] + 1j * v[..., 1])


def _conj(src: torch.Tensor) -> torch.Tensor:
    # PyTorch's conjugate view is an alias with the conjugate bit set; its C++ fallback then resolves the bit by
    # copying into an empty_like of the tpu tensor, which recursed until the stack overflowed (and a plain view
    # of ours, without the bit, read unconjugated: Autoformer's FFT autocorrelation in the full-zoo sweep). As
    # for view_as_real, tpu gives a conjugated copy: the values are right, but a write through `x.conj()` does
    # not reach `x` (models only read it). The negative view likewise.
    return dispatch(aten._conj_physical.default, (src,), {})


def _native_batch_norm(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                       momentum: float, eps: float) -> Any:
    """native_batch_norm updates running_mean/var in place in training, though its schema does not mark them
    written, so its functional lowering left a BatchNorm's running statistics at their initial values on
    tpu. Training runs the functional form (PyTorch's decomposition returns the new statistics) and copies
    them into the buffers."""
    args = (x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training or running_mean is None or running_var is None:
        return run_functional(aten.native_batch_norm.default, args, {})
    out, mean, rstd, new_mean, new_var = run_functional(aten._native_batch_norm_legit_functional.default, args, {})
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, rstd


SPECIAL: dict[Any, Callable[..., Any]] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm,  # the same running-statistics contract
    aten._conj.default: _conj,
    aten._neg_view.default: lambda src: dispatch(aten.neg.default, (src,), {}),
    aten.view_as_real.default: _view_as_real,
    aten.view_as_complex.default: _view_as_complex,
    aten.empty.memory_format: _empty,
    aten.empty_strided.default: _empty_strided,
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
    aten.view.default: _view,
    aten.view.dtype: lambda src, dtype: T.wrap(lowering.view_dtype(T.value(src), dtype), dtype),  # a bitcast copy
    aten._unsafe_view.default: _view,
    aten._reshape_alias.default: lambda src, size, stride: _view(src, size),
    aten.alias.default: lambda src: T.make_view(src, list(src.shape), list(src.stride()), 0),
    aten.as_strided.default: _as_strided,
    aten.resize_.default: _resize_,
    aten.set_.source_Tensor: _set_source_tensor,
    aten.set_.source_Storage: serialization.set_source_storage,
    aten.set_.source_Storage_storage_offset: serialization.set_source_storage,
    aten.is_pinned.default: lambda *a, **k: False,
    aten.record_stream.default: lambda *a, **k: None,
    **optim_lowerings.eager_kernels(),  # fused optimizer steps: one program per step, traced hyperparameters
}


# ------------------------------------------------------------------------------------------- entry
# op -> how it is run, decided once per op: a dict lookup per call instead of the schema checks
# (OpOverload's hash is a Python function, so every extra dict or cache lookup costs a microsecond).
_routes: dict[Any, Callable[[Any, tuple, dict], Any]] = {}


def _route(op: Any) -> Callable[[Any, tuple, dict], Any]:
    special = SPECIAL.get(op)
    if special is not None:
        return lambda _op, args, kwargs: special(*args, **kwargs)
    kind = _kind(op)
    if torch.Tag.inplace_view in op.tags:
        return _inplace_view
    if kind == "functional":
        return _run_like_factory if _is_like_factory(op) else run_functional
    if kind == "view":
        return _generic_view
    return _run_mutating


def _run_like_factory(op: Any, args: tuple, kwargs: dict) -> Any:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "tpu":
        return _off_device_factory(op, args, kwargs)
    return run_functional(op, args, kwargs)


def dispatch(op: Any, args: tuple, kwargs: dict) -> Any:
    fused.current_op = op  # names what made a fused graph run
    try:
        route = _routes[op]
    except KeyError:
        route = _routes[op] = _route(op)
    return route(op, args, kwargs)


def _inplace_view(op: Any, args: tuple, kwargs: dict) -> Any:
    """`transpose_`, `unsqueeze_`, `t_`, `as_strided_`, ...: the tensor itself becomes the view (sizes and
    geometry); its values are not touched."""
    func = _functional_of(op)
    if func is None:
        raise lowering.NoLowering(op, " (no functional view op to take it from)")
    target = args[0]
    # an overload packet (transpose_ has one overload, transpose several): the dispatcher picks the overload
    view = func(*args, **kwargs) if isinstance(func, torch._ops.OpOverloadPacket) else dispatch(func, args, kwargs)
    target.data = view  # shallow-copies sizes and StorageImpl in C++: the payload (buffer + geometry) follows
    return target


def _run_mutating(op: Any, args: tuple, kwargs: dict) -> Any:
    """In-place and out= ops: computed functionally, then written into their targets."""
    kind = _kind(op)
    func = _functional_of(op)
    if func is None:
        if cpu_fallback_enabled():
            return _cpu_fallback(op, args, kwargs)
        raise lowering.NoLowering(op, " (no functional form to compute it from)")
    if kind == "inplace":
        target = args[0]
        res = run_functional(func, args, kwargs)
        if _writes_several(op):
            return _write_back(op, args, kwargs, res)
        if fused.ACTIVE and isinstance(res, torch.Tensor) and T.adopt_pending(target, res):
            return target
        T.assign(target, T.value(res) if isinstance(res, torch.Tensor) and not res.is_cpu else res)
        return target
    # out=: compute functionally, then store (resizing outputs of the wrong shape, as PyTorch does)
    kwargs = dict(kwargs)
    outs = [kwargs.pop(a.name) for a in op._schema.arguments if a.is_out and a.name in kwargs]
    fargs = {a.name for a in func._schema.arguments}
    # None kwargs are defaults; torchax lowerings often do not name them (e.g. mean's dtype)
    kwargs = {k: v for k, v in kwargs.items() if k in fargs and v is not None}
    res = run_functional(func, args, kwargs)
    results = list(res) if isinstance(res, (list, tuple)) else [res]
    for o, r in zip(outs, results, strict=False):
        if fused.ACTIVE and isinstance(r, torch.Tensor) and T.adopt_pending(o, r):
            continue
        v = T.value(r) if isinstance(r, torch.Tensor) and r.device.type == "tpu" else r
        if tuple(o.shape) != tuple(getattr(v, "shape", ())) and o.numel() != getattr(v, "size", -1):
            T.replace(o, float8.cast(v, dtypes.to_jax(o.dtype)))
        else:
            T.assign(o, v)
    return outs[0] if len(outs) == 1 else tuple(outs)


@functools.cache
def _written_arguments(op: Any) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def _writes_several(op: Any) -> bool:
    """In-place ops that write more than their first argument, or a list of tensors (GradScaler's
    `_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`): their functional form returns every
    written argument, in order."""
    first = op._schema.arguments[0]
    return len(_written_arguments(op)) > 1 or isinstance(first.type, torch.ListType)


def _write_back(op: Any, args: tuple, kwargs: dict, res: Any) -> Any:
    names = [a.name for a in op._schema.arguments]
    results = res if isinstance(res, (list, tuple)) else (res,)
    for name, new in zip(_written_arguments(op), results, strict=False):
        i = names.index(name)
        target = args[i] if i < len(args) else kwargs[name]
        for t, v in zip(target, new, strict=True) if isinstance(target, (list, tuple)) else ((target, new),):
            T.assign(t, T.value(v) if isinstance(v, torch.Tensor) else v)
    first = args[0]
    return None if isinstance(first, (list, tuple)) else first


def fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 fallback registered for every ATen op (device.py)."""
    return dispatch(op, args, kwargs)
