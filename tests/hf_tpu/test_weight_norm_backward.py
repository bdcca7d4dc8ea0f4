"""Weight norm trains on tpu: aten._weight_norm_interface_backward has CPU's gradients (wav2vec2-style convs)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hf_tpu.precision import cpu_reference


@pytest.mark.parametrize("dim", [0, 2])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["f32", "bf16"])
def test_weight_norm_conv_gradients_match_cpu(highest, dim, dtype, tol):
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(6, 6, 5, padding=2, groups=2), dim=dim)
    conv = conv.to(dtype)
    x = torch.randn(2, 6, 11, dtype=dtype)
    grads = {}
    for device in ("cpu", "tpu"):
        m = conv.to(device)
        m.zero_grad(set_to_none=True)
        # the oracle's float32 convolutions whatever an earlier test left in torch.backends (AMX-BF16 hosts)
        with cpu_reference() if device == "cpu" else contextlib.nullcontext():
            m(x.to(device)).float().square().sum().backward()
        grads[device] = {n: p.grad.detach().cpu().float() for n, p in m.named_parameters()}
        conv = conv.to("cpu")
    assert grads["tpu"].keys() == grads["cpu"].keys()
    for name, want in grads["cpu"].items():
        got = grads["tpu"][name]
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()), msg=name)
