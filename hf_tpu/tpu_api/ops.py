"""torch.tpu.ops with their meaning on any device: built from PyTorch ops, so they run on tpu (lowered by
hf-tpu like any other op), on CPU, and under torch.compile, with autograd where torch_tpu has it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def optimization_barrier(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs, ordered after everything that produced them (torch_tpu: `stablehlo.optimization_barrier`).

    An identity on values. hf-tpu's eager ops run one program each, so nothing fuses across the call there;
    inside torch.compile the stand-in does not pin XLA's scheduling (which changes speed, not results)."""
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError("optimization_barrier takes a sequence of tensors")
    return list(inputs)


def _group_ids(group_sizes: torch.Tensor, m: int) -> torch.Tensor:
    if group_sizes.dim() != 1:
        raise ValueError(f"group_sizes must be 1-D (one size per group), got shape {tuple(group_sizes.shape)}")
    sizes = group_sizes.to(device="cpu", dtype=torch.long)
    if int(sizes.sum()) != m:
        raise ValueError(f"group_sizes sum to {int(sizes.sum())}, but lhs has {m} rows")
    return torch.repeat_interleave(torch.arange(len(sizes)), sizes)


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """result[start_i:end_i] = lhs[start_i:end_i] @ rhs[i], groups of `group_sizes[i]` consecutive rows."""
    if lhs.dim() != 2 or rhs.dim() != 3:
        raise ValueError(f"ragged_dot takes lhs (m, k) and rhs (g, k, n), got {tuple(lhs.shape)} and {tuple(rhs.shape)}")
    gid = _group_ids(group_sizes, lhs.shape[0]).to(lhs.device)
    # Row by row against its group's matrix: differentiable in lhs and rhs through ordinary ops.
    result = torch.einsum("mk,mkn->mn", lhs, rhs[gid])
    if out is not None:
        return out.copy_(result)
    return result


def ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """result[i] = lhs[start_i:end_i].T @ grad_output[start_i:end_i], shape (g, k, n)."""
    gid = _group_ids(group_sizes, lhs.shape[0]).to(lhs.device)
    g = group_sizes.shape[0]
    per_row = lhs.unsqueeze(2) * grad_output.unsqueeze(1)
    zeros = torch.zeros((g, lhs.shape[1], grad_output.shape[1]), dtype=per_row.dtype, device=lhs.device)
    return zeros.index_add(0, gid, per_row)


_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _check_pool(n: int, input: torch.Tensor, *seqs: Sequence[int]) -> None:
    if input.dim() not in (n + 1, n + 2):
        raise ValueError(f"max_pool{n}d takes a {n + 1}-D or {n + 2}-D input, got {input.dim()}-D")
    for s in seqs:
        if len(s) != n:
            raise ValueError(f"max_pool{n}d: kernel_size, stride, padding and dilation need {n} values each, got {list(s)}")


def _pool(n: int, input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    _check_pool(n, input, kernel_size, stride, padding, dilation)
    return _POOL[n](input, list(kernel_size), list(stride), list(padding), list(dilation), ceil_mode)


def _pool_backward(n: int, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    # The maxima's positions are recomputed from `input`, as torch_tpu does: PyTorch's own VJP of the pooling.
    _check_pool(n, input, kernel_size, stride, padding, dilation)
    with torch.enable_grad():
        x = input.detach().requires_grad_(True)
        y = _POOL[n](x, list(kernel_size), list(stride), list(padding), list(dilation), ceil_mode)
        (grad,) = torch.autograd.grad(y, x, grad_output)
    return grad


def max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    """1-D max pooling without indices; arguments as F.max_pool1d, every sequence of one element."""
    return _pool(1, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    return _pool(2, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    return _pool(3, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool1d_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    return _pool_backward(1, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    return _pool_backward(2, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:  # noqa: ANN001, A002
    return _pool_backward(3, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode)


def splash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                is_causal: bool = True, local_window_size: int | None = None, enable_gqa: bool = False,
                **block_options: object) -> torch.Tensor:
    """Splash attention's result through scaled_dot_product_attention. Block sizes and layouts (kernel tuning
    on TPU) are accepted and do not change the result; a local window attends to the `local_window_size`
    previous positions and itself (causal)."""
    known = {"block_q", "block_kv", "block_dkv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
             "block_kv_dkv_compute", "block_q_dq", "block_kv_dq", "use_fused_bwd_kernel", "use_vmap_bwd",
             "q_layout", "k_layout", "v_layout"}
    unknown = set(block_options) - known
    if unknown:
        raise TypeError(f"splash_sdpa() got unexpected keyword arguments {sorted(unknown)}")
    n_heads, n_kv = q.shape[1], k.shape[1]
    if enable_gqa != (n_heads != n_kv):
        raise ValueError(f"enable_gqa ({enable_gqa}) does not match inputs: n_heads={n_heads}, n_kv_heads={n_kv}")
    if local_window_size is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    lq, lk = q.shape[-2], k.shape[-2]
    i = torch.arange(lq, device=q.device).unsqueeze(1)
    j = torch.arange(lk, device=q.device).unsqueeze(0)
    mask = (i - j >= 0) & (i - j <= local_window_size)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def _from_values_offsets(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets

    return nested_view_from_values_offsets(values, offsets)


def align_jagged_to_multiple(nt: torch.Tensor, multiple: int = 128, padding_value: float | int | bool = 0.0) -> torch.Tensor:
    """Pad a jagged NestedTensor's values buffer to a multiple of `multiple` rows; offsets unchanged."""
    values = nt.values()
    rem = values.size(0) % multiple
    if rem == 0:
        return nt
    pad = torch.full((multiple - rem, *values.shape[1:]), padding_value, dtype=values.dtype, device=values.device)
    return _from_values_offsets(torch.cat([values, pad]), nt.offsets())


def strip_jagged_padding(nt: torch.Tensor, valid_tokens: int | None = None) -> torch.Tensor:
    """Drop trailing padding rows beyond offsets[-1] (a view of the values buffer)."""
    offsets = nt.offsets()
    if valid_tokens is None:
        valid_tokens = int(offsets[-1].item()) if offsets.numel() else 0
    if nt.values().size(0) == valid_tokens:
        return nt
    return _from_values_offsets(nt.values()[:valid_tokens], offsets)


