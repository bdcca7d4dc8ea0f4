"""torch.optim's `foreach` ops on tpu: one program per call, scalars traced.

`AdamW()` with no `fused`/`foreach` argument runs the foreach implementation on tpu (PyTorch defaults to it
for PrivateUse1), and `clip_grad_norm_` uses `_foreach_norm` and `_foreach_mul_`. PyTorch's kernel for a
device without one of its own is a loop of the single-tensor op: one XLA program per parameter per call
(a 6-layer GPT-2's foreach AdamW step ran 541 programs), each with its Python scalars as constants. AdamW
hands `_foreach_div_` and `_foreach_addcdiv_` new scalars every step (the bias corrections), so every step
compiled a new program per distinct parameter shape (16 for that GPT-2) and wrote each to the executable
cache: a cache growing by 16 entries per step.

Here each call is one program over the whole list, made from the eager lowering of the single-tensor op
(lowering.find, the same JAX function the loop ran per tensor), with every Python scalar a traced argument
(weakly typed, as a Python number in JAX: a float32 tensor stays float32), so a new value is not a new
program. Only float32 and float64 lists are taken (16-bit ones keep the loop, whose lowerings round through
float32 per op as CPU does; no scalar value is then traced through a half-precision path). Anything else —
another device, views or a buffer twice among the tensors written in place, a lowering that cannot take a
traced scalar (found at the first call, then remembered) — runs PyTorch's loop as before. A 6-layer
GPT-2's foreach AdamW step: 541 programs and 16 programs made per step -> 8 and 0, 0.16-0.29 -> 0.024
CPU-s. In fused eager mode too: the call reads its tensors (their pending graph runs once, as one program)
and runs its own program; the loop's per-tensor nodes, with the scalars as constants of the graph, ran
177 programs and made 16 per step there (774 programs with clip_grad_norm_), now 9 and 0 (12).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import fused, op_registry
from hf_tpu import tensor as T
from hf_tpu.op_registry import lowers

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)

# foreach op -> the single-tensor functional op applied to each element; `value` renames the foreach op's
# scalar argument for the single op where their names differ (addcdiv/addcmul's `scalars` -> `value`).
_SINGLE: dict[Any, tuple[Any, str | None]] = {
    aten._foreach_mul_.Scalar: (aten.mul.Scalar, None),
    aten._foreach_mul_.Tensor: (aten.mul.Tensor, None),
    aten._foreach_mul_.List: (aten.mul.Tensor, None),
    aten._foreach_mul_.ScalarList: (aten.mul.Scalar, None),
    aten._foreach_div_.Scalar: (aten.div.Scalar, None),
    aten._foreach_div_.ScalarList: (aten.div.Scalar, None),
    aten._foreach_div_.List: (aten.div.Tensor, None),
    aten._foreach_div_.Tensor: (aten.div.Tensor, None),
    aten._foreach_add_.List: (aten.add.Tensor, None),
    aten._foreach_add_.ScalarList: (aten.add.Scalar, None),
    aten._foreach_sub_.Scalar: (aten.sub.Scalar, None),
    aten._foreach_sub_.List: (aten.sub.Tensor, None),
    aten._foreach_lerp_.Scalar: (aten.lerp.Scalar, None),
    aten._foreach_lerp_.List: (aten.lerp.Tensor, None),
    aten._foreach_addcmul_.Scalar: (aten.addcmul.default, "value"),
    aten._foreach_addcmul_.ScalarList: (aten.addcmul.default, "value"),
    aten._foreach_addcdiv_.Scalar: (aten.addcdiv.default, "value"),
    aten._foreach_addcdiv_.ScalarList: (aten.addcdiv.default, "value"),
    aten._foreach_maximum_.List: (aten.maximum.default, None),
    aten._foreach_sqrt.default: (aten.sqrt.default, None),
    aten._foreach_sqrt_.default: (aten.sqrt.default, None),
    aten._foreach_neg.default: (aten.neg.default, None),
    aten._foreach_neg_.default: (aten.neg.default, None),
    aten._foreach_mul.Scalar: (aten.mul.Scalar, None),
    aten._foreach_mul.Tensor: (aten.mul.Tensor, None),
    aten._foreach_add.Scalar: (aten.add.Scalar, None),
    aten._foreach_add.List: (aten.add.Tensor, None),
    aten._foreach_norm.Scalar: (aten.linalg_vector_norm.default, None),
    # capturable foreach Adam/AdamW's bias corrections from the on-device step counts
    aten._foreach_pow.ScalarAndTensor: (aten.pow.Scalar, None),
    aten._foreach_reciprocal_.default: (aten.reciprocal.default, None),
}
OPS: frozenset[Any] = frozenset(_SINGLE)


def _addcmul(x: Any, t1: Any, t2: Any, value: Any = 1) -> Any:
    return x + value * t1 * t2  # CPU's kernel and torch._refs, in this order


def _addcdiv(x: Any, t1: Any, t2: Any, value: Any = 1) -> Any:
    return x + value * t1 / t2


def _lerp(x: Any, end: Any, weight: Any) -> Any:
    from hf_tpu import optim_lowerings

    return optim_lowerings._lerp(x, end, weight)


# Single ops whose eager path is a decomposition (torch._refs) that checks a scalar's Python type, which a
# traced scalar fails: written here with CPU's formulas (the refs' order of operations)
lowers(aten.addcmul.default, kind="foreach_step")(_addcmul)
lowers(aten.addcdiv.default, kind="foreach_step")(_addcdiv)
lowers(aten.lerp.Scalar, aten.lerp.Tensor, kind="foreach_step")(_lerp)
_HAND = op_registry.table("foreach_step")


# arguments that stay constants of the program (a lowering branches on them: the norm's order, a dtype) and
# change rarely (SGD's and Adam's `alpha` is a hyperparameter); every other Python scalar is traced
_STATIC_NAMES = frozenset({"alpha", "ord", "dtype"})


def _kind(name: str, x: Any) -> str:
    """How an argument enters the program: a list of tensors ('T'), of scalars ('S'), one tensor ('t'), one
    traced scalar ('s'), or a constant ('c': None, a dtype, a static scalar); '?' for anything else."""
    if isinstance(x, list | tuple):
        if x and all(isinstance(v, torch.Tensor) for v in x):
            return "T"
        if x and all(type(v) in (int, float) for v in x):
            return "S"
        return "?"
    if isinstance(x, torch.Tensor):
        return "t"
    if type(x) in (int, float) and name not in _STATIC_NAMES:
        return "s"
    return "c" if x is None or type(x) in (int, float, bool, torch.dtype) else "?"


def _keyword(arg: Any, single_names: set[str], rename: str | None) -> str | None:
    """The keyword a foreach op's argument takes in the single op, or None for a positional one: add's
    alpha, the norm's dtype, addcdiv's value (which the ScalarList form calls `scalars`)."""
    if arg.name == "scalars":
        return rename
    if arg.name in single_names and (arg.kwarg_only or arg.name in ("dtype", rename)):
        return arg.name
    return None


@functools.cache
def _program(op: Any, kinds: tuple[str, ...], statics: tuple) -> Callable[..., Any]:
    """The call's program: every element's single-tensor op, in one jitted function of the lists, tensors
    and traced scalars; `statics`: (position, value) of the constant arguments."""
    from hf_tpu import lowering, xla_options

    single, rename = _SINGLE[op]
    fn = _HAND.get(single) or lowering.find(single)
    if fn is None:
        raise LookupError(f"no lowering for {single}")
    single_names = {a.name for a in single._schema.arguments}
    keyword = [_keyword(a, single_names, rename) for a in op._schema.arguments]
    const = dict(statics)

    def run(n: int, frames: tuple, *values: Any) -> list[Any]:
        out = []
        for i in range(n):
            args, kwargs = [], {}
            for pos, kind in enumerate(kinds):
                v = const[pos] if kind == "c" else values[pos]
                v = v[i] if kind in "TS" else v
                if keyword[pos] is None:
                    args.append(v)
                else:
                    kwargs[keyword[pos]] = v
            res = fn(*args, **kwargs)
            out.append(res if frames[i] is None else res.reshape(frames[i]))
        return out

    return xla_options.jit(run, static_argnums=(0, 1))


def _takes(args: tuple, kinds: tuple[str, ...], inplace: bool) -> bool:
    if fused.LAUNCH_BLOCKING or "?" in kinds:
        return False
    if inplace:  # tensors written in place: whole buffers, each once (the loop writes overlapping ones in turn)
        bufs = set()
        for t in args[0]:
            if not T.is_tpu(t):
                return False
            p = T.payload(t)
            if p.view is not None or id(p.buf) in bufs:
                return False
            bufs.add(id(p.buf))
    n = None
    dtype = args[kinds.index("T")][0].dtype if "T" in kinds else None
    for x, k in zip(args, kinds, strict=True):
        if k == "T":
            if n is None:
                n = len(x)
            elif len(x) != n:
                return False
            for t in x:
                if not T.is_tpu(t) or t.dtype not in _FLOATS or t.dtype != dtype:
                    return False
        elif k == "t" and (not T.is_tpu(x) or x.dim() != 0 or x.dtype not in _FLOATS):
            return False
        elif k == "S" and len(x) != n:
            return False
    return n is not None and n > 0


_refused: set[tuple] = set()  # (op, kinds, statics) whose program could not be made: the loop serves them


def kernel(op: Any) -> Callable[..., Any]:
    """The tpu kernel of foreach `op`: one program for the call (`_program`), else PyTorch's loop."""
    schema = op._schema
    names = tuple(a.name for a in schema.arguments)
    inplace = schema.name.endswith("_")
    loop = _loop(op)

    def run(*args: Any, **kwargs: Any) -> Any:
        full = list(args) + [kwargs[n] if n in kwargs else _default(schema.arguments[i])
                             for i, n in enumerate(names) if i >= len(args)]
        kinds = tuple(_kind(n, x) for n, x in zip(names, full, strict=True))
        if not _takes(tuple(full), kinds, inplace):
            return loop(*args, **kwargs)
        statics = tuple((i, x) for i, (x, k) in enumerate(zip(full, kinds, strict=True)) if k == "c")
        key = (op, kinds, statics)
        if key in _refused:
            return loop(*args, **kwargs)
        values = [None if k == "c" else [T.value(t) for t in x] if k == "T" else T.value(x) if k == "t"
                  else (list(x) if k == "S" else x) for x, k in zip(full, kinds, strict=True)]
        selfs = full[kinds.index("T")]  # the first list (`self`, or pow's exponents after a scalar base)
        try:
            frames = _frames(selfs) if inplace else (None,) * len(selfs)
            outs = _program(op, kinds, statics)(len(selfs), frames, *values)
        except Exception:  # noqa: BLE001 - a lowering that cannot take a traced scalar: PyTorch's loop
            _refused.add(key)
            return loop(*args, **kwargs)
        if inplace:
            for t, a in zip(selfs, outs, strict=True):
                T.assign(t, a)
            return None
        return [T.wrap(a.astype(_out_dtype(t)), t.dtype) for t, a in zip(selfs, outs, strict=True)]

    return run


def _frames(tensors: list[torch.Tensor]) -> tuple:
    """The shape each result is written in: its buffer's, where that is not the tensor's (a gradient made
    as a reshape of a whole buffer, 24 of a GPT-2's 76), so that tensor.assign stores it as it comes instead
    of reshaping it in a program of its own per tensor; else None."""
    out = []
    for t in tensors:
        shape = T.payload(t).buf.shape
        out.append(shape if shape != tuple(t.shape) else None)
    return tuple(out)


def _out_dtype(t: torch.Tensor) -> Any:
    from hf_tpu import dtypes

    return dtypes.to_jax(t.dtype)


def _default(arg: Any) -> Any:
    return arg.default_value if arg.has_default_value() else None


def _loop(op: Any) -> Callable[..., Any]:
    """PyTorch's own kernel for the op (CompositeExplicitAutograd: the loop of single-tensor ops)."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

    def loop(*args: Any, **kwargs: Any) -> Any:
        return op.redispatch(keys, *args, **kwargs)

    return loop


for _op in _SINGLE:
    lowers(_op, kind="eager")(kernel(_op))
