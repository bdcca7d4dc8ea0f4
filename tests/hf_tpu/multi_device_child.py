"""Run by tests/hf_tpu/test_multi_device.py in a process started with HF_TPU_NUM_DEVICES=2 (JAX fixes its
device count when it starts, so this cannot run in the test process). Checks tpu:0 and tpu:1 as a user
would, against CPU PyTorch, and prints one JSON line of what it found; the test asserts on it."""

from __future__ import annotations

import json

import torch

import hf_tpu
from hf_tpu import tensor as T
from hf_tpu.precision import cpu_reference


def _jax_device(t: torch.Tensor) -> int:
    (d,) = T.value(t).devices()
    return d.id


def _err(fn) -> str:  # noqa: ANN001
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        return f"{type(exc).__name__}: {exc}"
    return ""


def main() -> dict:
    hf_tpu.set_matmul_precision("highest")
    out: dict = {"tpu_count": torch.tpu.device_count(), "accel_count": torch.accelerator.device_count()}
    torch.manual_seed(0)
    a = torch.randn(4, 5)
    x0, x1 = a.to("tpu:0"), a.to("tpu:1")
    out["devices"] = [str(x0.device), str(x1.device)]
    out["jax_devices"] = [_jax_device(x0), _jax_device(x1)]
    y1 = torch.tanh(x1) * 2 + x1.sum(0)
    with cpu_reference():
        ref = torch.tanh(a) * 2 + a.sum(0)
    out["op_device"], out["op_jax"] = str(y1.device), _jax_device(y1)
    out["op_err"] = (y1.cpu() - ref).abs().max().item()
    back = y1.to("tpu:0")
    out["copy"] = [str(back.device), _jax_device(back), torch.equal(back.cpu(), y1.cpu())]
    out["mixed"] = _err(lambda: x0 + x1)
    out["mixed_cpu"] = _err(lambda: x1 + a)
    made = [torch.zeros(3, device="tpu:1"), torch.arange(4, device="tpu:1"), torch.rand(3, device="tpu:1"),
            torch.empty_like(x1), x1.new_ones(2), x1[1:], x1.t(), x1.view(20), torch.full((2,), 3.0, device="tpu:1")]
    out["made"] = sorted({f"{t.device}/{_jax_device(t)}" for t in made})

    # the current device: where device="tpu" tensors go, per thread, restored by torch.tpu.device(i)
    torch.tpu.set_device(1)
    cur = [torch.tpu.current_device(), torch.accelerator.current_device_index(), str(torch.ones(1, device="tpu").device)]
    with torch.tpu.device(0):
        cur += [torch.tpu.current_device(), str(torch.ones(1, device="tpu").device)]
    cur.append(torch.tpu.current_device())
    torch.tpu.set_device(0)
    out["current"] = cur
    out["bad_index"] = [_err(lambda: torch.ones(1, device="tpu:5")), _err(lambda: torch.tpu.set_device(2)),
                        _err(lambda: a.to("tpu:2"))]

    # per-device memory: 1 MiB more on tpu:1 only
    before = [torch.tpu.memory_allocated(i) for i in range(2)]
    big = torch.ones(256, 1024, device="tpu:1")
    after = [torch.tpu.memory_allocated(i) for i in range(2)]
    out["memory_delta"] = [after[i] - before[i] for i in range(2)]
    out["accel_memory_1"] = torch.accelerator.memory_allocated(1) == after[1]
    del big

    # a model split over the two devices: forward and backward as on CPU
    torch.manual_seed(1)
    ref_model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    model.load_state_dict(ref_model.state_dict())
    model[0].to("tpu:0")
    model[2].to("tpu:1")
    h = model[1](model[0](a.to("tpu:0")))
    y = model[2](h.to("tpu:1"))
    loss = (y ** 2).mean()
    loss.backward()
    with cpu_reference():
        ref_loss = (ref_model(a) ** 2).mean()
        ref_loss.backward()
    out["split"] = {
        "devices": [str(model[0].weight.grad.device), str(model[2].weight.grad.device), str(y.device)],
        "loss_err": abs(loss.item() - ref_loss.item()),
        "grad_err": max((p.grad.cpu() - q.grad).abs().max().item()
                        for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)),
    }
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt.step()
    out["after_step"] = sorted({str(p.device) for p in model.parameters()})
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()))
