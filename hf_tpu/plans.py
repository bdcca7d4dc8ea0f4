"""Eager mode's fast path: an op's second call with the same signature runs its cached program directly.

The general path (eager_functional._run_functional) re-derives, on every call, things that depend only on
the op, the argument dtypes and the static arguments: the lowering, integer promotion, PyTorch's output dtypes, the
jit program. That is most of a small op's cost (a + b on 16 elements: ~70 of ~90 us). After a call has gone
the general way once, its answers are kept as a Plan under that signature, and a repeat call is: build the
key, fetch the arrays, call the program, wrap the result (or, in fused mode, record it as a node). Shapes
are not in the key (the program is a jax.jit, which specialises to shapes itself); dtypes and 0-dim-ness
are (they decide PyTorch's dtypes).

A plan has one output array, or a flat tuple of them (`native_layer_norm`, `var_mean`, `max.dim`, `topk`):
a multi-output op that took the general path on every call cost Strict a full signature derivation, and
fused mode a graph boundary (GPT-2's 25 layer norms cut its forward into 27 programs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import dtypes, fused, precision
from hf_tpu import tensor as T

NOT_PLANNABLE = object()
_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class Plan:
    """A lowering replaced at run time goes through hooks.override_lowerings, which forgets every plan, so a
    plan need not remember which lowering its program came from. `multi`: None for one output, else the
    container type of the outputs (tuple or list)."""

    __slots__ = ("program", "promote_to", "out_dtypes", "casts", "multi", "whole")

    def __init__(self, program: Callable[..., Any], promote_to: Any, out_dtypes: tuple[torch.dtype, ...],
                 casts: tuple[Any, ...], multi: type | None) -> None:
        self.program, self.promote_to = program, promote_to
        self.out_dtypes, self.casts, self.multi = out_dtypes, casts, multi
        self.whole = self._whole()

    def _whole(self) -> Callable[[list[Any]], Any]:
        """The plan as one function of its arrays (promotion, program, casts): what Strict runs and what a
        fused-mode node records. It reads `self.program` per call, so a program swapped on the plan (the
        tests' call counters) is the one that runs."""
        promote_to, casts = self.promote_to, self.casts
        if self.multi is None:
            cast = casts[0]

            def whole(arrays: list[Any]) -> Any:
                if promote_to is not None:
                    arrays = [a.astype(promote_to) for a in arrays]
                res = self.program(*arrays)
                return res if cast is None else res.astype(cast)

            return whole

        def whole_multi(arrays: list[Any]) -> tuple[Any, ...]:
            if promote_to is not None:
                arrays = [a.astype(promote_to) for a in arrays]
            return tuple(r if c is None else r.astype(c)
                         for r, c in zip(self.program(*arrays), casts, strict=True))

        return whole_multi


table: dict[Any, Plan] = {}


def is_array(x: Any) -> bool:
    """A JAX array (or tracer, or numpy array), not a torch tensor."""
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, torch.Tensor)


def make(program: Callable[..., Any], promote_to: Any, res: Any, out: Any) -> Plan | None:
    """The plan for repeating a general-path call whose program returned `res` and whose tensors are `out`;
    None when the result is not one array or a flat tuple (list) of arrays, each a tensor of `out`."""
    if is_array(res) and isinstance(out, torch.Tensor):
        want = dtypes.to_jax(out.dtype)
        return Plan(program, promote_to, (out.dtype,), (want if want != res.dtype else None,), None)
    # a named tuple (torch.return_types, a decomposition's) is handed back as a plain tuple: the dispatcher
    # unpacks either alike
    if (isinstance(res, tuple | list) and isinstance(out, tuple | list) and res and len(res) == len(out)
            and all(is_array(r) for r in res) and all(isinstance(o, torch.Tensor) for o in out)):
        wants = [dtypes.to_jax(o.dtype) for o in out]
        casts = tuple(w if w != r.dtype else None for w, r in zip(wants, res, strict=True))
        return Plan(program, promote_to, tuple(o.dtype for o in out), casts,
                    tuple if isinstance(out, tuple) else list)
    return None


def describe(x: Any, arrays: list[Any]) -> Any:
    """An argument's part of the plan key (NOT_PLANNABLE when the general path must take the call); a tpu
    tensor's array (or its view's buffer) is appended to `arrays`."""
    if isinstance(x, torch.Tensor):
        # `x.is_cpu`, not `x.device.type`: building the device object costs a microsecond, on every argument
        if x.is_cpu:
            return NOT_PLANNABLE
        # the operand is taken once, here: whether a view is handed over as geometry depends on its cache
        try:
            o = T.operand(x, fused.ACTIVE)
        except RuntimeError:  # another device (meta, ...): the general path raises the proper error
            return NOT_PLANNABLE
        if type(o) is T.Operand:
            arrays.append(o.array)
            return (x.dtype, x.dim() == 0, o.key)
        arrays.append(o)
        return (x.dtype, x.dim() == 0)
    if isinstance(x, _SCALARS):
        if x != x:  # NaN is never equal to itself: as a key it would add a plan on every call
            return NOT_PLANNABLE
        return (type(x), x)  # the type too: 1, 1.0 and True are equal keys but give different dtypes
    if isinstance(x, list | tuple):
        if all(type(v) is int for v in x):
            return (type(x), tuple(x))
        if x and all(isinstance(v, torch.Tensor) for v in x):  # cat, stack: op_jit takes their arrays in order
            parts = tuple(describe(v, arrays) for v in x)
            return NOT_PLANNABLE if NOT_PLANNABLE in parts else (type(x), parts)
    return NOT_PLANNABLE  # tensor lists, CPU tensors, anything unusual: the general path


def signature(op: Any, args: tuple, kwargs: dict) -> tuple[tuple | None, list[Any]]:
    """The plan key, and the tpu tensors' arrays in op_jit's order (positional arguments, then keyword
    arguments by name): a view's buffer when the program reads the view itself."""
    key = [op, precision.current(), torch.get_default_dtype()]  # factories without a dtype use the default
    arrays: list[Any] = []
    for x in args:
        d = describe(x, arrays)
        if d is NOT_PLANNABLE:
            return None, arrays
        key.append(d)
    for name in sorted(kwargs):
        d = describe(kwargs[name], arrays)
        if d is NOT_PLANNABLE:
            return None, arrays
        key.append((name, d))
    return tuple(key), arrays


def block(x: Any) -> None:
    # TORCH_TPU_LAUNCH_BLOCKING: wait for the op. A tracer (inside a decomposition being traced) has nothing
    # to wait for.
    wait = getattr(x, "block_until_ready", None)
    if wait is not None:
        wait()


def run(plan: Plan, arrays: list[Any], blocking: bool) -> Any:
    """Strict: the op's result now, as tpu tensors."""
    res = plan.whole(arrays)
    if plan.multi is None:
        if blocking:
            block(res)
        return T.wrap(res, plan.out_dtypes[0])
    if blocking:
        for r in res:
            block(r)
    return plan.multi(T.wrap(r, dt) for r, dt in zip(res, plan.out_dtypes, strict=True))


def defer(plan: Plan, arrays: list[Any], op: Any) -> Any:
    """Fused mode: the op recorded as a pending node; its tensors' arrays are made when something reads them."""
    node = fused.defer(plan.whole, arrays, op)
    if plan.multi is None:
        return T.wrap_pending(node, plan.out_dtypes[0])
    return plan.multi(T.wrap_pending(fused.part(node, i), dt) for i, dt in enumerate(plan.out_dtypes))
