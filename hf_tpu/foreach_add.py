"""`torch._foreach_add_(tensors, scalar)` on tpu: deferred, then one program for the whole list.

Every torch.optim step that keeps its step counts in tensors on the device (`fused=True`, `capturable=True`)
starts with `torch._foreach_add_(state_steps, 1)`. PyTorch's kernel for a device without one of its own is a
loop of `add_`, so on tpu that was one XLA program per parameter: 76 of the 93 programs of a fused AdamW step
on a 6-layer GPT-2 (the fused step itself was the other 17).

Here the call only records the addition: each tensor's Buffer gets a loader (`_Pending`) and keeps no array,
and the group holds the old arrays. The fused optimizer step that follows (optim_lowerings.py) sees its
`state_steps` waiting on one group (`waiting`), takes the old counts and adds inside its own program, so a
fused step is one program. Anything else that reads one of the tensors first (`.cpu()`, an op, a
state_dict copy) runs the additions of the whole group as one program (`_Group.run`), so a capturable
foreach step pays one program for its counters instead of one per parameter.

Only the plain case is deferred: Python-number scalars, every tensor a whole buffer of its own (no view, no
buffer twice), floating tensors or integer ones with an integer scalar, not under launch blocking (where
an op must finish, and fail, where it is issued) and not in fused eager mode (which defers the loop's ops). Anything else runs PyTorch's composite kernel as before.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu import fused
from hf_tpu import tensor as T
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


class _Group:
    """One deferred `_foreach_add_`: the buffers, their arrays from before, and the scalar."""

    __slots__ = ("bufs", "olds", "scalar", "_lock", "__weakref__")

    def __init__(self, bufs: list[T.Buffer], olds: list[Any], scalar: float | int) -> None:
        self.bufs, self.olds, self.scalar = bufs, olds, scalar
        self._lock = threading.Lock()

    def run(self) -> None:
        """Every addition in one program, written to the buffers still waiting for it (a buffer written
        since, e.g. by the fused step that took its addition over, keeps what it holds)."""
        with self._lock:
            if self.olds is None:
                return
            news = _program()(self.olds, self.scalar)
            for buf, new in zip(self.bufs, news, strict=True):
                loader = buf._loader
                if type(loader) is _Pending and loader.group is self:
                    buf.array = new  # the setter: the loader goes, the new array is held
            self.olds = None  # the old arrays may go now


class _Pending:
    """A waiting buffer's loader: runs its group and hands back the buffer's new array."""

    __slots__ = ("group", "index")

    def __init__(self, group: _Group, index: int) -> None:
        self.group, self.index = group, index

    def __call__(self) -> Any:
        self.group.run()
        return self.group.bufs[self.index]._array


@functools.cache
def _program() -> Callable[..., Any]:
    from hf_tpu import xla_options

    def add(olds: list[Any], scalar: Any) -> list[Any]:
        # the scalar is a traced (weakly typed) argument: a new value is not a new program
        return [(a + scalar).astype(a.dtype) for a in olds]

    return xla_options.jit(add)


def waiting(tensors: list[torch.Tensor]) -> tuple[list[Any], float | int] | None:
    """When every tensor of `tensors` is a whole buffer waiting on one deferred addition: their arrays from
    before it and its scalar, for a program that adds itself and then writes the tensors (which ends their
    wait). Else None: reading the tensors runs the additions."""
    group = None
    olds = []
    for t in tensors:
        p = T.payload(t)
        loader = p.buf._loader
        if type(loader) is not _Pending or p.view is not None:
            return None
        if group is None:
            group = loader.group
            if group.olds is None:
                return None
        elif loader.group is not group:
            return None
        olds.append(group.olds[loader.index])
    return (olds, group.scalar) if group is not None else None


def _deferrable(tensors: list[torch.Tensor], scalar: Any) -> bool:
    # fused eager mode defers the loop's add_ itself, into the pending graph; deferring here would read
    # (and so run) each tensor's pending graph on its own (76 graphs for a GPT-2's list)
    if fused.ACTIVE or fused.LAUNCH_BLOCKING or not tensors or type(scalar) not in (int, float):
        return False
    seen: set[int] = set()
    for t in tensors:
        if not T.is_tpu(t) or t.requires_grad or not (t.dtype.is_floating_point or (
                type(scalar) is int and t.dtype not in (torch.bool,) and not t.dtype.is_complex)):
            return False
        p = T.payload(t)
        if p.view is not None or p.buf.numel != math.prod(t.shape) or id(p.buf) in seen:
            return False
        seen.add(id(p.buf))
    return True


@lowers(aten._foreach_add_.Scalar, kind="eager")
def foreach_add_scalar_(tensors: list[torch.Tensor], scalar: Any) -> None:
    if not _deferrable(tensors, scalar):
        for t in tensors:  # what PyTorch's composite kernel (foreach_tensor_add_scalar_kernel_slow_) does
            t.add_(scalar)
        return
    bufs = [T.payload(t).buf for t in tensors]
    olds = [b.array for b in bufs]  # a buffer still waiting on an earlier addition runs it here
    group = _Group(bufs, olds, scalar)
    for i, b in enumerate(bufs):
        b.defer(_Pending(group, i), b.shape)  # drops the array (the group holds it) and moves the version
