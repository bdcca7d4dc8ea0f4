"""Views as geometry over a buffer, read and written on the device with XLA's own regular ops.

A view is a chain of steps; each step is `(sizes, strides, offset)` over the row-major (flat) frame of
the stage before it, the first over the buffer. Taking a view of a view folds the new step into the last
one whenever the two compose into one strided layout (a slice of a transpose, a transpose of a slice,
a reshape of contiguous dims: what PyTorch's strides express); otherwise (a reshape across a transpose,
which PyTorch lets through because every tpu tensor reports itself contiguous) the step is appended.

Each step is read with reshape, slice, transpose and broadcast, all static, so inside a jitted program
XLA fuses it into its consumer (a `weight.t()` becomes the dot's dimension numbers; no copy). Only a step
whose strides overlap or do not divide one another (`unfold`, unusual `as_strided`) is a gather, and its
positions are computed on the device from iotas, never as a host array. Writes run the chain backwards
with `dynamic_update_slice` (or a scatter for gather steps): PyTorch's view-replay-plus-scatter scheme,
which is what functionalization does, written here over JAX arrays because the stand-in's tensors have
no strides of their own for functionalization to read.

Everything here is pure geometry plus trace-friendly jnp code; tensor.py owns the buffers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

Step = tuple[tuple[int, ...], tuple[int, ...], int]
View = tuple[Step, ...]


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def check_bounds(sizes: Sequence[int], strides: Sequence[int], offset: int, frame_numel: int) -> None:
    """PyTorch's as_strided bounds check, against the frame the step reads (a tpu tensor's logical size)."""
    if _numel(sizes) == 0:
        return
    hi = offset + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
    lo = offset + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if s < 0)
    if lo < 0 or hi >= frame_numel:
        raise RuntimeError(
            f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage offset {offset} are out of "
            f"bounds for a tpu tensor of {frame_numel} elements"
        )


def is_identity(step: Step, frame_numel: int) -> bool:
    """The step reads the whole frame in order: the view is only a reshape."""
    sizes, strides, offset = step
    if offset != 0 or _numel(sizes) != frame_numel:
        return False
    return all(n == 1 or s == c for n, s, c in zip(sizes, strides, _contiguous_strides(sizes), strict=True))


@functools.lru_cache(maxsize=65536)
def _fold(step1: Step, step2: Step) -> Step | None:
    """`step2` (over the contiguous frame of step1's sizes) composed with `step1` as one step, or None.

    Step1's dims are coalesced into groups that are linear in the buffer. Each dim of step2 must move
    within one group, and every group's digit of step2's offset plus the furthest those dims reach must
    stay inside the group: then no position carries between groups and the composition is affine."""
    sizes1, strides1, off1 = step1
    sizes2, strides2, off2 = step2
    if 0 in sizes1 or 0 in sizes2:
        return None  # an empty frame has zero frame strides (no digits to take); the chain reads nothing anyway
    groups: list[list[int]] = []  # [size, buffer stride, frame stride]
    frame = _contiguous_strides(sizes1)
    for n, s, f in zip(sizes1, strides1, frame, strict=True):
        if n == 1:
            continue
        if groups and groups[-1][1] == n * s:  # the previous dim continues this one in the buffer
            groups[-1][0] *= n
            groups[-1][1] = s
            groups[-1][2] = f
        else:
            groups.append([n, s, f])
    digits, rest = [], off2
    for n, _, f in groups:
        digits.append((rest // f) % n)
    used = [0] * len(groups)
    out_strides = []
    for n, s in zip(sizes2, strides2, strict=True):
        if n == 1 or s == 0:
            out_strides.append(0)
            continue
        if s < 0:
            return None
        for g, (gn, gs, gf) in enumerate(groups):
            if gf <= s < gf * gn:
                if s % gf:
                    return None
                m = s // gf
                used[g] += (n - 1) * m
                out_strides.append(m * gs)
                break
        else:
            return None
    if any(d + u >= g[0] for d, u, g in zip(digits, used, groups, strict=True)):
        return None
    offset = off1 + sum(d * g[1] for d, g in zip(digits, groups, strict=True))
    return tuple(sizes2), tuple(out_strides), offset


def compose(view: View | None, frame_numel: int, buffer_numel: int, sizes: Sequence[int],
            strides: Sequence[int], offset: int) -> View | None:
    """The view of `as_strided(sizes, strides, offset)` taken over a tensor that reads `view` of its buffer
    (`frame_numel`: that tensor's element count). None means the whole buffer in order."""
    step: Step = (tuple(int(s) for s in sizes), tuple(int(s) for s in strides), int(offset))
    check_bounds(step[0], step[1], step[2], frame_numel)
    if view is not None:
        folded = _fold(view[-1], step)
        if folded is None:
            return view + (step,)
        view, step = view[:-1], folded
        if view:
            return view + (step,)
    return None if is_identity(step, buffer_numel) else (step,)


def sizes(view: View) -> tuple[int, ...]:
    return view[-1][0]


# ------------------------------------------------------------------------------------- reading
@functools.lru_cache(maxsize=65536)
def _regular_plan(sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple | None:
    """How a step reads with regular ops, or None (it needs a gather).

    The dims that move (size > 1, stride > 0) sorted by stride, largest first, must nest: each stride a
    multiple of the next, and the next dim's extent inside it. Then the window of `n0 * s0` elements from
    the offset, reshaped to (n0, s0/s1, ..., s_k), and sliced to (n0, n1, ..., n_k, 1), is the view with
    its moving dims in stride order."""
    moving = sorted((d for d, (n, s) in enumerate(zip(sizes, strides, strict=True)) if n > 1 and s != 0),
                    key=lambda d: -strides[d])
    if any(strides[d] < 0 for d in moving):
        return None
    ns = [sizes[d] for d in moving]
    ss = [strides[d] for d in moving]
    for i in range(len(moving) - 1):
        if ss[i] % ss[i + 1] or ss[i] < ns[i + 1] * ss[i + 1]:
            return None
    if not moving:
        return (tuple(moving), 1, (1,), (1,))
    factors = [ns[0]] + [ss[i] // ss[i + 1] for i in range(len(ss) - 1)] + [ss[-1]]
    keep = list(ns) + [1]
    return tuple(moving), ns[0] * ss[0], tuple(factors), tuple(keep)


def is_regular(step: Step) -> bool:
    return _regular_plan(step[0], step[1]) is not None


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy


def _lax() -> Any:
    from hf_tpu import runtime

    return runtime.jax().lax


def _finish(block: Any, sizes: tuple[int, ...], moving: tuple[int, ...]) -> Any:
    """A block of the moving dims in stride order, as the view: dims back in order, size-1 and
    broadcast (stride 0) dims put in."""
    jnp = _jnp()
    order = sorted(range(len(moving)), key=lambda i: moving[i])
    if order != list(range(len(moving))):
        block = jnp.transpose(block, order)
    in_order = sorted(moving)
    shape = [sizes[d] if d in in_order else 1 for d in range(len(sizes))]
    block = block.reshape(shape)
    if tuple(shape) != sizes:
        block = jnp.broadcast_to(block, sizes)
    return block


def _window(flat: Any, offset: int, length: int) -> Any:
    """flat[offset : offset + length], zero-padded past the end (the last row of a window may overhang)."""
    lax = _lax()
    n = flat.shape[0]
    end = min(n, offset + length)
    w = flat if (offset == 0 and end == n) else lax.slice(flat, (offset,), (end,))
    if offset + length > n:
        w = lax.pad(w, _zero(flat.dtype), ((0, offset + length - n, 0),))
    return w


def _zero(dtype: Any) -> Any:
    return _jnp().zeros((), dtype)


def _positions(step: Step, n: int) -> Any:
    """Flat positions a step reads, computed on the device (inside the program that uses them)."""
    jnp, lax = _jnp(), _lax()
    sizes, strides, offset = step
    idt = jnp.int32 if n < 2**31 else jnp.int64
    pos = jnp.full(sizes, offset, idt)
    for d, (sz, st) in enumerate(zip(sizes, strides, strict=True)):
        if sz > 1 and st != 0:
            pos = pos + lax.broadcasted_iota(idt, sizes, d) * st
    return pos


def read_step(flat: Any, step: Step) -> Any:
    """The value a step reads from a flat (1-D) array; traceable."""
    sizes, strides, offset = step
    jnp, lax = _jnp(), _lax()
    if _numel(sizes) == 0:
        return jnp.zeros(sizes, flat.dtype)
    plan = _regular_plan(sizes, strides)
    if plan is None:
        return flat[_positions(step, flat.shape[0])]
    moving, length, factors, keep = plan
    block = _window(flat, offset, length).reshape(factors)
    if keep != factors:
        block = lax.slice(block, (0,) * len(keep), keep)
    block = block.reshape(keep[:-1]) if moving else block.reshape(())
    return _finish(block, sizes, moving)


def write_step(flat: Any, step: Step, value: Any) -> Any:
    """`flat` with the elements the step reads replaced by `value` (of the step's sizes); traceable."""
    sizes, strides, offset = step
    jnp, lax = _jnp(), _lax()
    if _numel(sizes) == 0:
        return flat
    plan = _regular_plan(sizes, strides)
    if plan is None:
        return flat.at[_positions(step, flat.shape[0]).reshape(-1)].set(value.reshape(-1))
    moving, length, factors, keep = plan
    # the value's moving dims in stride order; broadcast dims (stride 0) hold one element: take it
    idx = tuple(slice(None) if (d in moving) else 0 for d in range(len(sizes)))
    v = value[idx]
    kept = sorted(moving)
    v = jnp.transpose(v, [kept.index(d) for d in moving]) if moving else v
    v = v.reshape(keep)
    n = flat.shape[0]
    window = _window(flat, offset, length).reshape(factors)
    window = lax.dynamic_update_slice(window, v.astype(flat.dtype), (0,) * len(factors)).reshape(-1)
    end = min(n, offset + length)
    if offset == 0 and end == n and length == n:
        return window
    return lax.dynamic_update_slice(flat, window[: end - offset], (offset,))


def read(array: Any, view: View) -> Any:
    """The value `view` reads from a buffer array; traceable."""
    x = array
    for step in view:
        x = read_step(x.reshape(-1), step)
    return x


def write(array: Any, view: View, value: Any) -> Any:
    """The buffer array with the elements `view` reads replaced by `value`; traceable."""
    stages = [array]
    for step in view[:-1]:
        stages.append(read_step(stages[-1].reshape(-1), step))
    new = value
    for stage, step in zip(reversed(stages), reversed(view), strict=True):
        new = write_step(stage.reshape(-1), step, new.reshape(step[0])).reshape(stage.shape)
    return new


@functools.lru_cache(maxsize=4096)
def read_program(view: View) -> Any:
    from hf_tpu import xla_options

    return xla_options.jit(lambda a: read(a, view))


@functools.lru_cache(maxsize=4096)
def write_program(view: View) -> Any:
    from hf_tpu import xla_options

    return xla_options.jit(lambda a, v: write(a, view, v))


def fusable(view: View) -> bool:
    """Cheap enough to recompute inside every program that reads it (no gather)."""
    return all(is_regular(s) for s in view)
