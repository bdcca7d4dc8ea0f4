"""Hand-written JAX lowerings for ATen ops torchax 0.0.13 lacks or gets wrong for torch 2.13 (registered with
op_registry.lowers). Each is written by hand because neither torchax nor PyTorch's decomposition table
has a usable one:

  eye, eye.m            -> jnp.eye (PyTorch's `eye` makes its result with a CPU `empty` inside `eye.out`)
  range, range.step     -> jnp.arange with the end included (deprecated `torch.range`, still used)
  searchsorted          -> jnp.searchsorted, batched over leading dims; right=/side=/sorter=/out_int32
                           (torchax's takes only 1-D sequences and no keywords)
  _thnn_fused_lstm_cell, _thnn_fused_gru_cell and their backward kernels: PyTorch runs nn.LSTM/GRU(Cell)
                           through these CUDA-only fused kernels on every PrivateUse1 device
  repeat_interleave.Tensor -> jnp.repeat with total_repeat_length=output_size when the caller gives it, so a
                           compiled graph traces (torchax's always needs concrete repeats: Kimi K2.5's
                           vision tower passes output_size and failed with a ConcretizationTypeError)
  _embedding_bag(_forward_only) -> segment sums over the bags. torchax's ignores per_sample_weights (Kimi
                           K2.5's bicubic position interpolation came out wrong in eager) and walks the
                           offsets in numpy (a tracer error in compiled graphs)
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import dtypes
from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy


def _factory_dtype(dtype: torch.dtype | None, default: torch.dtype | None = None) -> Any:
    return dtypes.to_jax(dtype or default or torch.get_default_dtype())


@lowers(aten.eye.default, aten.eye.m)
def _eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return _jnp().eye(int(n), None if m is None else int(m), dtype=_factory_dtype(dtype))


@lowers(aten.range.default, aten.range.step)
def _range(start: Any, end: Any, step: Any = 1, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    """torch.range: [start, end] inclusive, length floor((end - start) / step) + 1, float by default."""
    jnp = _jnp()
    n = int((float(end) - float(start)) // float(step)) + 1
    want = _factory_dtype(dtype)
    return (jnp.asarray(start, dtype=jnp.float64 if want == jnp.float64 else jnp.float32)
            + jnp.arange(max(n, 0)) * step).astype(want)


@lowers(aten.searchsorted.Tensor)
def _searchsorted(sorted_sequence: Any, values: Any, *, out_int32: bool = False, right: bool = False,
                  side: str | None = None, sorter: Any = None) -> Any:
    """torch.searchsorted: `side` wins over `right` (PyTorch raises when they disagree, before dispatch); an
    N-D sequence searches each row of its last dim for the values of the matching row."""
    from hf_tpu import runtime

    jax = runtime.jax()
    jnp = jax.numpy
    how = side or ("right" if right else "left")
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int32), axis=-1)
    vals = jnp.asarray(values)
    if seq.ndim == 1:
        out = jnp.searchsorted(seq, vals, side=how)
    else:
        rows = seq.reshape(-1, seq.shape[-1])
        per_row = vals.reshape(rows.shape[0], -1)
        out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=how))(rows, per_row).reshape(vals.shape)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowers(aten.searchsorted.Scalar)
def _searchsorted_scalar(sorted_sequence: Any, value: Any, **kwargs: Any) -> Any:
    return _searchsorted(sorted_sequence, _jnp().asarray(value, dtype=sorted_sequence.dtype), **kwargs)


def _sigmoid(x: Any) -> Any:
    from hf_tpu import runtime

    return runtime.jax().nn.sigmoid(x)


@lowers(aten._thnn_fused_lstm_cell.default)
def _lstm_cell(input_gates: Any, hidden_gates: Any, cx: Any, input_bias: Any = None,
               hidden_bias: Any = None) -> tuple[Any, Any, Any]:
    """(hy, cy, workspace); gates in PyTorch's order i, f, g, o; workspace holds the activated gates [B, 4H]
    (the layout of PyTorch's CUDA kernel, which its backward below reads)."""
    jnp = _jnp()
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = _sigmoid(i), _sigmoid(f), jnp.tanh(g), _sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def _lstm_cell_backward(grad_hy: Any, grad_cy: Any, cx: Any, cy: Any, workspace: Any,
                        has_bias: bool) -> tuple[Any, Any, Any]:
    """(grad_gates, grad_cx, grad_bias) of the cell above; an undefined output gradient counts as zero."""
    jnp = _jnp()
    i, f, g, o = jnp.split(workspace, 4, axis=1)
    tanh_cy = jnp.tanh(cy)
    zero = jnp.zeros_like(cy)
    ghy = zero if grad_hy is None else grad_hy
    gcy = (zero if grad_cy is None else grad_cy) + ghy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate([gcy * g * i * (1 - i), gcy * cx * f * (1 - f), gcy * i * (1 - g * g),
                                  ghy * tanh_cy * o * (1 - o)], axis=1)
    grad_bias = grad_gates.sum(axis=0) if has_bias else None
    return grad_gates, gcy * f, grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def _gru_cell(input_gates: Any, hidden_gates: Any, hx: Any, input_bias: Any = None,
              hidden_bias: Any = None) -> tuple[Any, Any]:
    """(hy, workspace); gates r, z, n; n = tanh(i_n + r * h_n). workspace = [r, z, n, h_n, hx] as in PyTorch's
    CUDA kernel."""
    jnp = _jnp()
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, inn = jnp.split(input_gates, 3, axis=1)
    hr, hz, hn = jnp.split(hidden_gates, 3, axis=1)
    r, z = _sigmoid(ir + hr), _sigmoid(iz + hz)
    n = jnp.tanh(inn + r * hn)
    hy = (1 - z) * n + z * hx
    return hy, jnp.concatenate([r, z, n, hn, hx], axis=1)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def _gru_cell_backward(grad_hy: Any, workspace: Any, has_bias: bool) -> tuple[Any, ...]:
    """(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    jnp = _jnp()
    r, z, n, hn, hx = jnp.split(workspace, 5, axis=1)
    dn = grad_hy * (1 - z) * (1 - n * n)
    dz = grad_hy * (hx - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    gi = jnp.concatenate([dr, dz, dn], axis=1)
    gh = jnp.concatenate([dr, dz, dn * r], axis=1)
    if not has_bias:
        return gi, gh, grad_hy * z, None, None
    return gi, gh, grad_hy * z, gi.sum(axis=0), gh.sum(axis=0)


def _fbgemm_round(x: Any, half: Any) -> Any:
    """float32 `x` rounded to `half` as fbgemm writes its float32 sums (returned as float32): float16 to
    nearest even, bfloat16 to nearest with ties away from zero (it adds half a bfloat16 ulp to the bits and
    truncates: an OpInfo bag summing exactly to a half-way point, 0.689453125, came out 0.69140625 on CPU)."""
    import jax

    jnp = _jnp()
    if half != jnp.bfloat16:
        return x.astype(half).astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    away = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x8000)) & jnp.uint32(0xFFFF0000), jnp.float32)
    return jnp.where(jnp.isnan(x), x.astype(half).astype(jnp.float32), away)


@lowers(aten._embedding_bag.default)
def _embedding_bag(weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False, mode: int = 0,
                   sparse: bool = False, per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: int = -1, *, _forward_only: bool = False) -> tuple:
    """(output, offset2bag, bag_size, max_indices) with the shapes CPU's kernel gives (the last three only feed
    its backward). Bags are segments of `indices` starting at `offsets`; every shape is static, so this traces."""
    import jax

    jnp = _jnp()
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags]
    # the bag of each index; the last bag runs to the end (CPU's kernel does not bound it by a last offset)
    bag_of = jnp.searchsorted(starts, jnp.arange(n), side="right") - 1
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
    valid = valid & (bag_of >= 0)
    seg = jnp.where(valid, bag_of, bags)  # an extra segment collects what no bag counts (padding)
    # half types as CPU's kernel (fbgemm's EmbeddingSpMDM): each bag's (weighted) rows summed in float32 and
    # rounded once, and a mean that sum, rounded, divided by the count and rounded again (bit-equal on
    # bfloat16 and float16; segment sums in the half type put 2 of 10 OpInfo elements outside tolerance)
    half = weight.dtype if weight.dtype in (jnp.bfloat16, jnp.float16) else None
    rows = weight[indices] if half is None else weight[indices].astype(jnp.float32)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    count = jax.ops.segment_sum(valid.astype(jnp.int64), seg, num_segments=bags + 1)[:bags]
    # sum mode's unused outputs: CPU's two kernels size them differently with include_last_offset
    zeros_b = jnp.zeros((offsets.shape[0] if _forward_only else bags,), jnp.int64)
    offset2bag = bag_of.astype(jnp.int64) if (mode != 0 or padding_idx >= 0) else jnp.zeros((0,), jnp.int64)
    if mode == 2:  # max
        rows = jnp.where(valid[:, None], rows, -jnp.inf)
        out = jax.ops.segment_max(rows, seg, num_segments=bags + 1)[:bags]
        out = jnp.where(count[:, None] > 0, out, 0).astype(weight.dtype)
        # the weight row holding each maximum (the first position, as CPU's loop keeps the first)
        hit = rows == jnp.concatenate([out, jnp.zeros((1, out.shape[1]), out.dtype)])[seg]
        first = jax.ops.segment_min(jnp.where(hit & valid[:, None], jnp.arange(n)[:, None], n), seg,
                                    num_segments=bags + 1)[:bags]
        max_idx = jnp.where(first < n, indices[jnp.minimum(first, n - 1)], 0).astype(jnp.int64)
        return out, offset2bag, count, max_idx
    rows = jnp.where(valid[:, None], rows, 0)
    out = jax.ops.segment_sum(rows, seg, num_segments=bags + 1)[:bags]
    if half is not None:
        out = _fbgemm_round(out, half)
    if half is not None and mode == 1:  # divided in float64: XLA makes x / broadcast(n) x * (1 / n), inexact
        out = (out.astype(jnp.float64) / jnp.maximum(count, 1)[:, None]).astype(jnp.float32)
        return out.astype(half), offset2bag, count, count
    if mode == 1:  # mean
        out = out / jnp.maximum(count, 1)[:, None].astype(out.dtype)
        return out.astype(weight.dtype), offset2bag, count, count
    return out.astype(weight.dtype), offset2bag, zeros_b, zeros_b


@lowers(aten.repeat_interleave.Tensor)
def _repeat_interleave(repeats: Any, *, output_size: int | None = None) -> Any:
    jnp = _jnp()
    return jnp.repeat(jnp.arange(repeats.shape[0]), repeats, total_repeat_length=output_size)


lowers(aten._embedding_bag_forward_only.default)(lambda *a, **k: _embedding_bag(*a, **k, _forward_only=True))


def _descending_key(jnp: Any, a: Any) -> tuple[Any, ...]:
    """Sort keys whose ascending order is CPU's descending comparator `a > b` (NaN first): ~a for integers
    and bool (monotone, no overflow, unlike -a at the minimum), (not NaN, -a) for floating point."""
    if jnp.issubdtype(a.dtype, jnp.bool_) or jnp.issubdtype(a.dtype, jnp.integer):
        return (~a,)
    return ((~jnp.isnan(a)).astype(jnp.int8), -a)


@lowers(aten.sort.default, aten.sort.stable)
def _sort(a: Any, dim: int = -1, descending: bool = False, stable: bool | None = False) -> tuple[Any, Any]:
    # Why not torchax's: for an unstable descending sort it reverses the ascending argsort, so tied values come
    # out in a different order than CPU's, whose kernel runs std::sort with a descending comparator; XLA:CPU's
    # unstable sort is that same std::sort, so sorting keys that order as that comparator does gives CPU's
    # indices for ties too (PP-DocLayoutV2 ranks a 0/1 mask with argsort(descending=True)). Ascending and stable
    # sorts already agree with CPU and keep JAX's path. Signed zeros still order -0.0 < 0.0 (XLA's total order).
    import jax
    jnp = _jnp()
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    if not descending or stable or jnp.issubdtype(a.dtype, jnp.complexfloating):
        return (jnp.sort(a, axis=dim, stable=bool(stable), descending=descending),
                jnp.argsort(a, axis=dim, stable=bool(stable), descending=descending))
    dim = dim % a.ndim
    keys = _descending_key(jnp, a)
    iota = jax.lax.broadcasted_iota(jnp.int64, a.shape, dim)
    *_, values, indices = jax.lax.sort((*keys, a, iota), dimension=dim, is_stable=False, num_keys=len(keys))
    return values, indices


@lowers(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(grad_w: Any, saved_v: Any, saved_g: Any, saved_norms: Any,
                                    dim: int) -> tuple[Any, Any]:
    # No library lowers it (torchax has none; PyTorch decomposes only the forward), and weight norm is in every
    # wav2vec2/HuBERT/SEW-D conv positional embedding and Oobleck's VAE: their training failed. The arithmetic is
    # CPU's WeightNorm kernel: w = g * v / |v| reduced over every dim but `dim`, half types accumulated in float32.
    jnp = _jnp()
    acc = jnp.promote_types(saved_v.dtype, jnp.float32)
    gw, v, g, norms = (t.astype(acc) for t in (grad_w, saved_v, saved_g, saved_norms))
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    per_dim_sum = jnp.sum(gw * v, axis=axes, keepdims=True)
    grad_v = (g / norms) * (gw - v * (per_dim_sum / (norms * norms)))
    grad_g = per_dim_sum / norms
    return grad_v.astype(saved_v.dtype), grad_g.reshape(saved_g.shape).astype(saved_g.dtype)
