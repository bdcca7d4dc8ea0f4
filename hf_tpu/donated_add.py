"""`target.add_(other)` on tpu written over target's own array (XLA buffer donation) when nothing else can
read that array.

Why: an in-place op is computed functionally and its result replaces the target's array (functionalize.py),
so `add_` on a large tensor allocated a second array of its size, faulted in page by page, beside the one
it replaces. Autograd sums a weight's gradients with `old.add_(new)` (InputBuffer, when the gradient's
storage has one owner) and AccumulateGrad adds into an existing `.grad` with `+=`: Qwen3's tied 151,936 x
1,024 embedding has two float32 gradients of 622 MB each, and their sum made a third (the training step's
peak RSS: +0.58 GB over CPU's, whose `add_` writes in place). Donating the target's array lets XLA write the
sum into it, as CPU does.

Only the plain case: same shape and dtype (floating), the target a whole buffer whose array has the tensor's
shape, loaded, held by that one buffer (memory.holders) and by no other Python object (a deepcopy shares
arrays between buffers; an array still referenced elsewhere would be left deleted), `other` a different
array, not in fused eager mode (which defers the op instead). Anything else takes the functional path. The
sum is aten.add's own eager lowering, so the bits are those of the functional path.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import dtypes, fused, memory, plans, xla_options
from hf_tpu import tensor as T
from hf_tpu.eager_functional import eager_lowering

aten = torch.ops.aten
# references to the target's array while add_ looks: its buffer's slot, the local name, getrefcount's argument
_OWNED_REFS = 3


def add_(target: torch.Tensor, other: Any, alpha: Any = 1) -> bool:
    """Add `alpha * other` into `target` over its own array; False (nothing done) outside the plain case."""
    if fused.ACTIVE or not isinstance(other, torch.Tensor) or other.device != target.device:
        return False
    if other.dtype != target.dtype or not target.dtype.is_floating_point or other.shape != target.shape:
        return False
    if type(alpha) not in (int, float):
        return False
    p = T.payload(target)
    buf = p.buf
    arr = buf._array
    if p.view is not None or arr is None or arr.shape != tuple(target.shape):
        return False
    if arr.dtype != dtypes.to_jax(target.dtype) or memory.holders(arr) != 1:
        return False
    if sys.getrefcount(arr) > _OWNED_REFS:
        return False
    o = T.value(other)
    if o is arr:
        return False
    new = _program(eager_lowering(aten.add.Tensor), alpha)(arr, o)
    del arr
    buf.replace_donated(new)
    if fused.LAUNCH_BLOCKING:
        plans.block(new)
    return True


@functools.cache
def _program(fn: Callable[..., Any], alpha: int | float) -> Callable[..., Any]:
    """aten.add's lowering `fn` with `alpha`, its first argument donated (XLA writes the result over it)."""
    return xla_options.jit(functools.partial(_add, fn, alpha), donate_argnums=(0,),
                           large=xla_options.OP_LARGE_ELEMENTS)


def _add(fn: Callable[..., Any], alpha: int | float, a: Any, b: Any) -> Any:
    return fn(a, b, alpha=alpha)
