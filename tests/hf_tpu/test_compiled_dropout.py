"""Dropout in a compiled training forward on tpu (issue 25): it compiled to a CPU-device tensor
(FakeTensorDeviceMismatchError), and the graph's random key must be an argument of the program, or every call
repeats the first call's mask."""

from __future__ import annotations

import torch
import torch.nn as nn

import hf_tpu  # noqa: F401  (registers `tpu`)


def test_compiled_dropout_draws_a_new_mask_each_call() -> None:
    drop = torch.compile(nn.Dropout(0.5).train(), backend="tpu")
    x = torch.ones(4000, device="tpu", requires_grad=True)
    torch.manual_seed(0)
    y1 = drop(x)
    y2 = drop(x)
    torch.manual_seed(0)
    y3 = drop(x)
    y1.sum().backward()
    y1, y2, y3 = y1.detach().cpu(), y2.detach().cpu(), y3.detach().cpu()
    # as CPU's dropout: kept values scaled by 1/(1-p), about p of them zeroed
    cpu = nn.Dropout(0.5).train()(torch.ones(4000))
    assert set(y1.unique().tolist()) == set(cpu.unique().tolist()) == {0.0, 2.0}
    assert abs((y1 == 0).float().mean().item() - 0.5) < 0.05
    assert not torch.equal(y1, y2)  # the program's key advances with the generator
    assert torch.equal(y1, y3)  # and follows torch.manual_seed
    assert torch.equal(x.grad.cpu(), y1)  # the backward uses the forward's mask


def test_compiled_model_with_dropout_trains_and_eval_matches_cpu(highest) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    tpu = torch.compile(model.to("tpu"), backend="tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        tpu(x.to("tpu")).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    cpu_model = model.to("cpu")
    want = cpu_model(x)
    got = torch.compile(cpu_model.to("tpu"), backend="tpu")(x.to("tpu")).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
