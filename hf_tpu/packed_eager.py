"""Strict eager's float32 dots against a weight packed once (MKL's GEMM format), the weight's array dropped.

Why (issue 31): a Strict-eager GPT-2 forward is its XLA programs' time, three quarters of it float32 dots, and
XLA's dot re-packs its weight operand on every call (~38% of its dot time). packed_weights.py keeps a weight's
packed copy in place of its array and computes products from it (an FFI handler writing into XLA's buffer);
this module hands eager `mm` / `addmm` to it: a float32 product whose weight (the second operand) is a whole
2-D tpu tensor or its transpose (nn.Linear's `weight.t()`), with a 1-D bias, at precision "highest", where no
gradient is needed, becomes one small program calling the packed handler.

Eager sees one op at a time, so which weights other ops read (a tied embedding: its gather reads the array, and
every read of a dropped array rebuilds it from the copy, K/64 identity products: ~1 s for Qwen3's 151,936 x
1,024 embedding) is learnt from what happens: the first dot that reads a weight computes with XLA and then
*watches* it (its array moved into a loader that hands it back: any other read calls that loader). A second
dot finding the weight watched and unread since packs it and drops the array; a weight read in between stays
XLA's and is watched again. So a tied embedding is never packed nor rebuilt (its gather reads it every forward).
A packed weight read back (state_dict, a training step, a read-modify-write) is rebuilt from its copy once and
keeps its array and XLA's dot from then on, as in compiled graphs (packed_weights._unpacked says why). A write
that replaces the array moves the buffer's version: the next dot frees the stale copy and watches the new array.

Eager programs run asynchronously: the outputs of packed dots not yet computed are kept here, and a copy is
freed only after them (packed_weights.before_free). Fused mode (TORCH_TPU_DEFER_AND_FUSE) keeps XLA's dot: run
as programs of their own, packed dots cut its pending graph at every dot, and GPT-2's fused forward took 1.33x
CPU eager's time instead of 1.13x (paired, quiet; /work/wt/notes/epack.md)."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hf_tpu import fused, memory, mm_grad_layout, op_jit, packed_weights, precision
from hf_tpu import tensor as T
from hf_tpu.eager_functional import run_functional
from hf_tpu.op_registry import lowers

aten = torch.ops.aten
_OP = "hf_tpu.packed_dot"  # names the handler's programs in op_jit's cache


@lowers(aten.mm.default, kind="eager")
def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten.mm on tpu in eager mode: from b's packed copy when it has one (the module's docstring), else as
    mm_grad_layout.mm (which also gives a Linear's weight gradient the weight's layout)."""
    out, watch = _packed(a, b, None)
    if out is None:
        out = mm_grad_layout.mm(a, b)
        if watch is not None:
            _watch(*watch)
    return out


@lowers(aten.addmm.default, kind="eager")
def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    """aten.addmm on tpu in eager mode: from b's packed copy when it has one (the module's docstring)."""
    if beta != 1 or alpha != 1:
        return run_functional(aten.addmm.default, (bias, a, b), {"beta": beta, "alpha": alpha})
    out, watch = _packed(a, b, bias)
    if out is None:
        out = run_functional(aten.addmm.default, (bias, a, b), {})
        if watch is not None:
            _watch(*watch)
    return out


def _packed(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
            ) -> tuple[torch.Tensor | None, tuple[Any, bool] | None]:
    """(x @ w (+ bias) from w's packed copy, None), or (None, what to watch once the caller has computed it
    with XLA: (w's Buffer, form), or None)."""
    weight = _weight(x, w, bias)
    if weight is None:
        return None, None
    buf, transposed = weight
    key = packed_weights.dropped_key(buf, transposed)
    if key is None:
        if not packed_weights.may_pack(buf):
            packed_weights.forget(buf)  # a copy read back (the array is here again): XLA's dot from now on
            return None, None
        key = _second_sighting(buf, transposed, int(x.shape[0]))
    if key is None:
        return None, weight
    n = buf.shape[0] if transposed else buf.shape[1]
    if bias is None:
        res = op_jit.call(_OP, _mm, (T.operand(x), key), {"n": n}, "highest", True)
    else:
        res = op_jit.call(_OP, _addmm, (T.operand(bias), T.operand(x), key), {"n": n}, "highest", True)
    _running(res)
    return T.wrap(res, torch.float32), None


def _weight(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> tuple[Any, bool] | None:
    """(w's Buffer, whether w reads it transposed) when this product may come from a packed copy."""
    if precision.current() != "highest" or not packed_weights.ENABLED:
        return None  # "high"/"medium" round the operands: not what the packed float32 product computes
    if fused.ACTIVE:
        return None  # a packed dot would cut the pending graph at every dot: slower (the module's docstring)
    ts = (x, w) if bias is None else (x, w, bias)
    for t in ts:
        if not T.is_tpu(t) or t.dtype != torch.float32:
            return None
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0] or w.numel() < packed_weights.MIN_ELEMENTS:
        return None  # (a shape error is raised by XLA's path)
    if bias is not None and tuple(bias.shape) != (w.shape[1],):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return None  # training: autograd saves the weight for the backward, which reads its array
    p = T.payload(w)
    buf = p.buf
    if p.view is None:
        found = (buf, False) if buf.shape == tuple(w.shape) else None
    elif buf.shape == tuple(w.shape)[::-1] and mm_grad_layout.is_transposed_whole(w, buf):
        found = (buf, True)
    else:
        return None
    if found is None or not packed_weights.available():
        return None
    return found


# ------------------------------------------------------------------------------------- watching a weight
class _Watch:
    """A watched weight's loader: hands its array back (the weight read by something else than a dot)."""

    __slots__ = ("array", "called")

    def __init__(self, array: Any, shape: tuple[int, ...]) -> None:
        self.array, self.called = array, False
        memory.hold(array, shape)  # still the tensor's memory while the buffer does not hold it

    def __call__(self) -> Any:
        a, self.array = self.array, None
        self.called = True
        memory.release(a)  # the buffer holds it again
        return a

    def __del__(self, _release: Any = memory.release) -> None:
        if not self.called and self.array is not None:
            _release(self.array)


_watched: weakref.WeakKeyDictionary[Any, tuple[int, bool]] = weakref.WeakKeyDictionary()  # Buffer -> (version, form)


def _second_sighting(buf: Any, transposed: bool, rows: int) -> Any | None:
    """The key array of a copy packed now, if a dot watched buf (in this form, at this version) and nothing
    read it since; else None (the caller's XLA dot reads the array, then watches it)."""
    packed_weights.forget(buf)  # a copy of an older version (the weight written since)
    seen = _watched.pop(buf, None)
    if seen == (buf.version, transposed) and type(buf._loader) is _Watch:
        return packed_weights.pack_now(buf, packed_weights.Use(transposed, rows))
    return None


def _watch(buf: Any, transposed: bool) -> None:
    """Move buf's array into a _Watch (after the XLA dot that read it)."""
    a = buf._array
    if a is None or memory.holders(a) != 1 or not packed_weights.may_pack(buf):
        return  # shared with another tensor (dropping it would free nothing), or known not packable
    buf.defer(_Watch(a, buf.shape), buf.shape)
    _watched[buf] = (buf.version, transposed)


# ------------------------------------------------------------------------------------- the handler's programs
def _mm(x: Any, key: Any, n: int) -> Any:
    return packed_weights._packed_dot(x, key, None, n)


def _addmm(bias: Any, x: Any, key: Any, n: int) -> Any:
    return packed_weights._packed_dot(x, key, bias, n)


_queued: list[Any] = []  # outputs of packed dots that may not be computed yet


def _running(out: Any) -> None:
    _queued[:] = [a for a in _queued if not a.is_ready()]
    _queued.append(out)


def _wait() -> None:
    """Wait for every packed dot still queued (before a copy is freed)."""
    while _queued:
        _queued.pop().block_until_ready()


packed_weights.before_free.append(_wait)
