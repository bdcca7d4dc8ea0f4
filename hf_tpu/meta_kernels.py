"""Meta kernels (output shapes and dtypes only) for ATen ops PyTorch has none for. Fake tensors need one to
trace an op in a compiled graph; without it, on CPU they run the real kernel on zeros (an unsafe fallback), and
on tpu that fallback made real tpu tensors behind the backend ("this tpu:0 tensor has no data attached"), so
Dynamo failed with "RuntimeError when making fake tensor call". The shapes are the CPU kernels'. Registered
for the Meta key, so every device's fake tensors (CPU's too) take them."""

from __future__ import annotations

from typing import Any

import torch


def gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
             input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None) -> tuple:
    """aten._thnn_fused_gru_cell (PyTorch has one for the LSTM cell only): nn.GRUCell runs it on every
    PrivateUse1 device, so compiled graphs with a GRU cell (SLANet's table decoder) could not be traced.
    (hy [B, H], workspace [B, 5H]) as in PyTorch's CUDA kernel (r, z, n, h_n, hx) and hf_tpu's lowering."""
    h = hx.shape[1]
    if input_gates.shape != hidden_gates.shape or input_gates.shape[1] != 3 * h:
        raise RuntimeError(f"_thnn_fused_gru_cell: gates of shape {tuple(input_gates.shape)} and "
                           f"{tuple(hidden_gates.shape)} do not match hidden size {h} (expected [B, {3 * h}])")
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * h))


def gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool) -> tuple:
    """aten._thnn_fused_gru_cell_backward: (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias,
    grad_hidden_bias), the biases' only when has_bias."""
    b, h = grad_hy.shape
    gates = (grad_hy.new_empty((b, 3 * h)), grad_hy.new_empty((b, 3 * h)), grad_hy.new_empty((b, h)))
    if not has_bias:
        return (*gates, None, None)
    return (*gates, grad_hy.new_empty((3 * h,)), grad_hy.new_empty((3 * h,)))


def geqrf(a: torch.Tensor) -> tuple:
    """(a, tau [*, min(m, n)]): LAPACK's compact QR."""
    if a.dim() < 2:
        raise RuntimeError(f"geqrf: input must have at least 2 dimensions (got {a.dim()})")
    return a.new_empty(a.shape), a.new_empty((*a.shape[:-2], min(a.shape[-2], a.shape[-1])))


def histogram_bin_ct(x: torch.Tensor, bins: int = 100, *, range: Any = None,  # noqa: A002 - ATen's name
                     weight: torch.Tensor | None = None, density: bool = False) -> tuple:
    """(hist [bins], bin_edges [bins + 1]) in the input's dtype."""
    return x.new_empty((bins,)), x.new_empty((bins + 1,))


def histogram_bins_tensor(x: torch.Tensor, bins: torch.Tensor, *, weight: torch.Tensor | None = None,
                          density: bool = False) -> tuple:
    """(hist [len(bins) - 1], bin_edges [len(bins)])."""
    return x.new_empty((bins.numel() - 1,)), x.new_empty((bins.numel(),))


def histogramdd_bin_edges(x: torch.Tensor, bins: list[int], *, range: Any = None,  # noqa: A002
                          weight: torch.Tensor | None = None, density: bool = False) -> list[torch.Tensor]:
    """One edge tensor [bins[d] + 1] per dimension d."""
    return [x.new_empty((b + 1,)) for b in bins]


def histogramdd_from_bin_cts(x: torch.Tensor, bins: list[int], *, range: Any = None,  # noqa: A002
                             weight: torch.Tensor | None = None, density: bool = False) -> torch.Tensor:
    return x.new_empty(tuple(bins))


def histogramdd_from_bin_tensors(x: torch.Tensor, bins: list[torch.Tensor], *, weight: torch.Tensor | None = None,
                                 density: bool = False) -> torch.Tensor:
    return x.new_empty(tuple(b.numel() - 1 for b in bins))


KERNELS = {
    "_thnn_fused_gru_cell": gru_cell, "_thnn_fused_gru_cell_backward": gru_cell_backward, "geqrf": geqrf,
    "histogram.bin_ct": histogram_bin_ct, "histogram.bins_tensor": histogram_bins_tensor,
    "_histogramdd_bin_edges": histogramdd_bin_edges, "_histogramdd_from_bin_cts": histogramdd_from_bin_cts,
    "_histogramdd_from_bin_tensors": histogramdd_from_bin_tensors,
}
_LIB: Any = None


def register() -> None:
    """Register each kernel PyTorch still lacks (a later PyTorch's own wins), once per process."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")  # kept alive: dropping it unregisters the kernels
    for name, fn in KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _LIB.impl(name, fn, "Meta")
