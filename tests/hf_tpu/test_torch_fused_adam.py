"""Float32 Adam(W)(fused=True) steps run PyTorch's own fused CPU kernel inside the step program, on buffers XLA
aliases from input to output (torch_dot_ffi.fused_adam): CPU's bits, in one pass over the arrays."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import torch_dot_ffi

pytestmark = pytest.mark.skipif(not torch_dot_ffi.ensure(), reason=f"no handlers: {torch_dot_ffi.status()}")


def _steps(device: str, cls: type, steps: int = 3, **kwargs: object) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 32).to(device)), torch.nn.Parameter(torch.randn(7).to(device))]
    opt = cls(params, lr=1e-2, fused=True, **kwargs)
    torch.manual_seed(1)
    for k in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape).to(device)
        opt.param_groups[0]["lr"] = 1e-2 / (k + 1)  # a schedule: lr is traced, one program
        opt.step()
    state = [t for p in params for t in (opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"], opt.state[p]["step"])]
    return [t.detach().cpu() for t in (*params, *state)]


@pytest.mark.parametrize("cls,kwargs", [(torch.optim.AdamW, {"weight_decay": 0.1}),
                                        (torch.optim.Adam, {"weight_decay": 0.1}),
                                        (torch.optim.AdamW, {"maximize": True, "betas": (0.8, 0.95)})])
def test_fused_adam_steps_are_cpu_pytorchs_bits(cls: type, kwargs: dict) -> None:
    calls = torch_dot_ffi.calls("fused_adam")
    got = _steps("tpu", cls, **kwargs)
    assert torch_dot_ffi.calls("fused_adam") == calls + 3
    for a, b in zip(got, _steps("cpu", cls, **kwargs), strict=True):
        assert torch.equal(a, b)


def test_amsgrad_keeps_the_program_of_its_own() -> None:
    calls = torch_dot_ffi.calls("fused_adam")
    got = _steps("tpu", torch.optim.AdamW, amsgrad=True)
    assert torch_dot_ffi.calls("fused_adam") == calls
    for a, b in zip(got, _steps("cpu", torch.optim.AdamW, amsgrad=True), strict=True):
        torch.testing.assert_close(a, b)
