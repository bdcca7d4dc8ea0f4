"""An op with no JAX lowering of its own, run in eager mode as one XLA program of its decomposition.

Run as it is, a decomposition is many ops: `tril` is an arange, two unsqueezes, a compare and a where;
SDPA's math path is about thirty ops (masks, scaling, two batched matmuls, softmax, the fully-masked-row
fix). In eager mode each is a dispatch and an XLA call. Here the decomposition is traced once under
`jax.jit` instead: its tpu tensors hold tracers, its sub-ops go through dispatch as usual (their
lowerings trace, nothing runs), and op_jit caches the program per (op, static arguments, shapes) like a
lowering's. The decomposition itself is PyTorch's (or torchax's), so the result is the one it gives.

Two kinds of decomposition must not become a program:
- one that reads a value on the host (`.item()`, a branch on a tensor, a data-dependent shape) raises a
  JAX tracer error while being traced; op_jit then marks the op untraceable and runs it plainly;
- one that draws random numbers would have its PRNG key frozen into the program (the same numbers on every
  call); a draw while tracing raises `op_jit.Untraceable` for the same fallback.

While tracing, fused eager mode (fused.py) is off: a deferred sub-op would be a node of tracers, and reading
it would run the pending graph inside the trace, handing every pending tensor still held a tracer for a value
(an UnexpectedTracerError when one is read later).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from hf_tpu import fused, op_jit, rng
from hf_tpu import tensor as T
from hf_tpu.errors import TpuOpError


def traceable(op: Any) -> bool:
    """Whether `op`'s decomposition may be run as a traced program. Not factories (an argument names the
    device): their decompositions make tensors where `device=` says, which a trace of arrays cannot honour
    (`rand_like`'s decomposition makes a CPU tensor when device is None); they keep running as they are."""
    return not any(a.name == "device" for a in op._schema.arguments)


def as_lowering(op: Any, dec: Callable[..., Any]) -> Callable[..., Any]:
    """A JAX function of arrays computing `dec` (a decomposition of `op` written in torch ops). A new
    function object each call: op_jit keys programs by it (dispatch makes one per lowering table)."""
    from hf_tpu import runtime

    tracer = runtime.jax().core.Tracer

    def wrap(x: Any) -> Any:
        return T.wrap(x) if T.is_jax_array(x) else x

    def lowering(*args: Any, **kwargs: Any) -> Any:
        leaves = pytree.tree_leaves((args, kwargs))
        tracing = any(isinstance(x, tracer) for x in leaves)
        draws, key = rng.draws(), rng.get_state()
        targs, tkwargs = pytree.tree_map(wrap, (args, kwargs))
        try:
            # a functional op on arrays: autograd is above us (dispatch runs below it); traced, its sub-ops
            # trace inline rather than being deferred (fused.py)
            with torch.no_grad(), fused.defer_and_fuse(False) if tracing else contextlib.nullcontext():
                out = dec(*targs, **tkwargs)
        except TpuOpError as exc:  # a sub-op's tracer error, wrapped with its op's name: let op_jit see it
            if tracing:
                rng.set_state(key)
                if isinstance(exc.__cause__, op_jit.tracer_errors()):
                    raise exc.__cause__ from None
            raise
        except BaseException:
            if tracing:
                rng.set_state(key)
            raise
        if tracing and rng.draws() != draws:
            rng.set_state(key)  # the draws made tracers of the key: put the real one back, then run plainly
            raise op_jit.Untraceable(f"{op} draws random numbers")
        return pytree.tree_map_only(torch.Tensor, T.value, out)

    return lowering
