"""Hand-written JAX lowerings for ATen ops torchax 0.0.13 lacks or gets wrong for torch 2.13 (lowering.py merges
them into HAND_LOWERINGS). Each is written by hand because neither torchax nor PyTorch's decomposition table
has a usable one:

  eye, eye.m            -> jnp.eye (PyTorch's `eye` makes its result with a CPU `empty` inside `eye.out`)
  range, range.step     -> jnp.arange with the end included (deprecated `torch.range`, still used)
  searchsorted          -> jnp.searchsorted, batched over leading dims; right=/side=/sorter=/out_int32
                           (torchax's takes only 1-D sequences and no keywords)
  _thnn_fused_lstm_cell, _thnn_fused_gru_cell and their backward kernels: PyTorch runs nn.LSTM/GRU(Cell)
                           through these CUDA-only fused kernels on every PrivateUse1 device
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu import dtypes

aten = torch.ops.aten


def _jnp() -> Any:
    from hf_tpu import runtime

    return runtime.jax().numpy


def _factory_dtype(dtype: torch.dtype | None, default: torch.dtype | None = None) -> Any:
    return dtypes.to_jax(dtype or default or torch.get_default_dtype())


def _eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return _jnp().eye(int(n), None if m is None else int(m), dtype=_factory_dtype(dtype))


def _range(start: Any, end: Any, step: Any = 1, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    """torch.range: [start, end] inclusive, length floor((end - start) / step) + 1, float by default."""
    jnp = _jnp()
    n = int((float(end) - float(start)) // float(step)) + 1
    want = _factory_dtype(dtype)
    return (jnp.asarray(start, dtype=jnp.float64 if want == jnp.float64 else jnp.float32)
            + jnp.arange(max(n, 0)) * step).astype(want)


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


def _searchsorted_scalar(sorted_sequence: Any, value: Any, **kwargs: Any) -> Any:
    return _searchsorted(sorted_sequence, _jnp().asarray(value, dtype=sorted_sequence.dtype), **kwargs)


def _sigmoid(x: Any) -> Any:
    from hf_tpu import runtime

    return runtime.jax().nn.sigmoid(x)


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


OP_LOWERINGS: dict[Any, Any] = {
    aten.eye.default: _eye,
    aten.eye.m: _eye,
    aten.range.default: _range,
    aten.range.step: _range,
    aten.searchsorted.Tensor: _searchsorted,
    aten.searchsorted.Scalar: _searchsorted_scalar,
    aten._thnn_fused_lstm_cell.default: _lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: _lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: _gru_cell,
    aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward,
}
