"""Issue 25, item 6: the HF training stack picks `tpu` (Accelerate, safetensors); compared with CPU."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, batches, step) -> list[float]:
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        step(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_accelerator_trains_on_tpu_with_cpu_losses(fresh_accelerate_state, highest):
    from accelerate import Accelerator

    acc = Accelerator()
    assert acc.device.type == "tpu"
    torch.manual_seed(0)
    data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(3)]
    ref = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1),
                                     torch.utils.data.DataLoader(data, batch_size=None))
    assert next(model.parameters()).device.type == "tpu"
    batches = list(loader)
    assert batches[0][0].device.type == "tpu"  # Accelerate's DataLoader places batches on its device
    want = _train(ref, ref_opt, data, lambda loss: loss.backward())
    got = _train(model, opt, batches, acc.backward)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_without_the_patch_accelerate_picks_cpu():
    code = """
        import torch, accelerate
        print("device", accelerate.Accelerator().device)
    """
    assert "device tpu:0" in _run(code).stdout
    assert "device cpu" in _run(code, HF_TPU_NO_PATCHES="1").stdout


def test_safetensors_load_file_to_tpu(tmp_path):
    from safetensors.torch import load_file, save_file

    ref = {"w": torch.randn(3, 4), "h": torch.randn(5).to(torch.bfloat16)}
    save_file({k: v.to("tpu") for k, v in ref.items()}, tmp_path / "x.safetensors")
    for device in ("tpu", "tpu:0", torch.device("tpu")):
        got = load_file(tmp_path / "x.safetensors", device=device)
        for k, v in ref.items():
            assert got[k].device.type == "tpu"
            assert torch.equal(got[k].cpu(), v), k
    assert load_file(tmp_path / "x.safetensors")["w"].device.type == "cpu"
    code = f"""
        import torch
        from safetensors.torch import load_file
        try:
            load_file({str(tmp_path / "x.safetensors")!r}, device="tpu")
        except Exception as e:
            print("error", e)
    """
    assert "device tpu is invalid" in _run(code, HF_TPU_NO_PATCHES="1").stdout
