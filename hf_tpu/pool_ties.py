"""aten.max_pool2d/3d_with_indices with CPU's index when a window's maximum ties (or holds NaNs).

Why not torchax's: its index reduction keeps `a` when a.value >= b.value, an order-dependent rule, and XLA does
not fix the order in which reduce_window combines a window's elements: a window with two equal maxima gave CPU's
index in eager (nn.functional.max_pool3d int32/int64 passed) and another one compiled, where the same
lowering sits in a bigger program (flat index 37 for CPU's 13 on OpInfo's first sample).

CPU's kernel (ATen/native/cpu/MaxPoolKernel.cpp) scans a window in index order and takes an element when
`val > maxval || isnan(val)`: the first of tied maxima, the last NaN, and the window's first element when
nothing beats its -inf start. That choice is the maximum of a total order on (value, index) pairs, which any
combining order reaches: NaNs above numbers and a later NaN above an earlier one; a larger number above a
smaller one, and of equal numbers the earlier index. Padding (ceil_mode's and `padding`'s) is -inf with an
index past every real one, so a real -inf wins its tie with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _first_max(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """The greater of two (value, index) pairs in CPU's scan order (the module's docstring)."""
    jnp = _jax().numpy
    (av, ai), (bv, bi) = a, b
    if jnp.issubdtype(av.dtype, jnp.floating):
        an, bn = jnp.isnan(av), jnp.isnan(bv)
        take_a = jnp.where(an | bn, an & (~bn | (ai > bi)), (av > bv) | ((av == bv) & (ai < bi)))
    else:
        take_a = (av > bv) | ((av == bv) & (ai < bi))
    return jnp.where(take_a, av, bv), jnp.where(take_a, ai, bi)


def _max_pool_with_indices(spatial: int) -> Callable[..., tuple[Any, Any]]:
    def lowering(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                 ceil_mode: bool = False) -> tuple[Any, Any]:
        """(values, flat index within each plane), CPU's choice among ties; values as torchax's."""
        from torchax.ops import jaten

        jax = _jax()
        jnp = jax.numpy

        def per_dim(v: Any) -> tuple[int, ...]:
            v = [v] if isinstance(v, int) else list(v)
            return tuple(v * spatial if len(v) == 1 else v)

        kernel = per_dim(kernel_size)
        strides = per_dim(stride) if (isinstance(stride, int) or len(stride)) else kernel
        pads, dil = per_dim(padding), per_dim(dilation)
        values = jaten.max_pool(x, kernel, strides, list(pads), dil, ceil_mode, with_index=False)
        batch = x.ndim - spatial
        full = x if batch == 2 else x[None]  # reduce_window's padding below names (N, C) dims
        window_pads = jaten._ceil_mode_padding(list(pads), full.shape, kernel, strides, dil, ceil_mode)
        plane = x.shape[-spatial:]
        idx = jnp.broadcast_to(jnp.arange(math.prod(plane)).reshape(plane), x.shape)
        low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
        _, indices = jax.lax.reduce_window(
            (x, idx), (jnp.asarray(low, x.dtype), jnp.asarray(jnp.iinfo(idx.dtype).max, idx.dtype)), _first_max,
            (1,) * batch + kernel, (1,) * batch + strides, ((0, 0),) * batch + tuple(map(tuple, window_pads)),
            window_dilation=(1,) * batch + dil)
        return values, indices.astype(jnp.int64)

    return lowering


lowers(aten.max_pool2d_with_indices.default)(_max_pool_with_indices(2))
lowers(aten.max_pool3d_with_indices.default)(_max_pool_with_indices(3))
