"""Issue 25, item 6: the HF training stack picks `tpu` (Accelerate, safetensors); compared with CPU."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hf_tpu.precision import cpu_reference


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


def test_accelerator_device_is_tpu_and_the_patch_covers_accelerate_without_torch_accelerator():
    """Accelerate 1.16 asks torch.accelerator, which hf_tpu's hooks answer with tpu; Accelerate versions that
    only probe devices by name (simulated: its backend lookup finds none) returned cpu, which the patch fixes."""
    code = """
        import torch, accelerate
        print("device", accelerate.Accelerator().device)
    """
    assert "device tpu" in _run(code).stdout
    older = """
        import torch, accelerate.state
        accelerate.state.get_torch_accelerator_backend = lambda: (None, None)
        print("device", accelerate.Accelerator().device)
    """
    assert "device tpu" in _run(older).stdout
    assert "device cpu" in _run(older, HF_TPU_NO_PATCHES="1").stdout


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


# ------------------------------------------------------------------ Trainer, PEFT, compiled step, checkpoints
class _Tokens(torch.utils.data.Dataset):
    """Causal-LM batches (labels = inputs) from a fixed generator: the same on both devices."""

    def __init__(self, n: int = 8, length: int = 16, vocab: int = 99) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _tiny(kind: str) -> torch.nn.Module:
    import _hf_tiny
    from transformers import BertForMaskedLM, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(_hf_tiny.llama())
    # dropout off: the two devices draw different masks
    return BertForMaskedLM(_hf_tiny.bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _trainer_losses(kind: str, use_cpu: bool, tmp_path, **args) -> tuple[list[float], str, torch.nn.Module]:
    from transformers import Trainer, TrainingArguments

    targs = TrainingArguments(str(tmp_path / ("cpu" if use_cpu else "tpu")), use_cpu=use_cpu,
                              per_device_train_batch_size=4, max_steps=3, logging_steps=1, report_to=[],
                              save_strategy="no", learning_rate=1e-2, seed=0, data_seed=0, **args)
    trainer = Trainer(model=_tiny(kind), args=targs, train_dataset=_Tokens())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, next(trainer.model.parameters()).device.type, trainer.model


@pytest.mark.parametrize("kind", ["llama", pytest.param("bert", marks=pytest.mark.slow)])
def test_trainer_trains_on_tpu_with_cpu_losses(kind, tmp_path, fresh_accelerate_state, highest):
    """Trainer(use_cpu=False) picks tpu (its DataLoader pins memory, its optimizer is fused AdamW by default)
    and logs CPU's losses."""
    with cpu_reference():
        want, where, _ = _trainer_losses(kind, True, tmp_path)
    assert where == "cpu"
    got, where, _ = _trainer_losses(kind, False, tmp_path)
    assert where == "tpu"
    assert got == pytest.approx(want, rel=1e-4)


def test_trainer_bf16_autocast_on_tpu_as_on_cpu(tmp_path, fresh_accelerate_state, highest):
    with cpu_reference():
        want, _, _ = _trainer_losses("llama", True, tmp_path, bf16=True)
    got, where, _ = _trainer_losses("llama", False, tmp_path, bf16=True)
    assert where == "tpu"
    assert got == pytest.approx(want, rel=2e-3)  # bfloat16 rounding (CPU's autocast lists are not CUDA's)


def test_save_pretrained_after_tpu_training_reloads_the_weights(tmp_path, fresh_accelerate_state):
    from transformers import LlamaForCausalLM

    _, where, model = _trainer_losses("llama", False, tmp_path)
    assert where == "tpu"
    model.save_pretrained(tmp_path / "saved")
    for device in ("cpu", "tpu"):
        loaded = LlamaForCausalLM.from_pretrained(tmp_path / "saved", device_map=device)
        got = loaded.state_dict()
        for k, v in model.state_dict().items():
            assert got[k].device.type == device
            assert torch.equal(got[k].cpu(), v.cpu()), k


def _lora_losses(device: str, compiled: bool = False) -> list[float]:
    from peft import LoraConfig, get_peft_model

    model = _tiny("llama")
    torch.manual_seed(1)  # LoRA's A matrices are drawn here: the same on both devices
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    model = model.to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    ids = _Tokens().ids[:4].to(device)
    losses = []
    for _ in range(3):
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_peft_lora_trains_on_tpu_as_on_cpu(compiled, highest):
    with cpu_reference():
        want = _lora_losses("cpu")
    assert _lora_losses("tpu", compiled) == pytest.approx(want, rel=1e-4)


@pytest.mark.slow
def test_compiled_training_step_with_dropout(highest):
    """torch.compile of a Transformers model in training mode with attention and hidden dropout: it failed to
    compile (FakeTensorDeviceMismatchError at dropout); with dropout at 0 its losses are CPU's."""
    from transformers import LlamaForCausalLM

    import _hf_tiny

    ids = _Tokens().ids[:2]

    def losses(device: str, p: float, compiled: bool) -> list[float]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(_hf_tiny.llama(attention_dropout=p)).to(device).train()
        fwd = torch.compile(model, backend="tpu") if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for _ in range(2):
            loss = fwd(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    dropped = losses("tpu", 0.5, True)
    assert all(math.isfinite(v) for v in dropped)
    with cpu_reference():
        want = losses("cpu", 0.0, False)
    assert losses("tpu", 0.0, True) == pytest.approx(want, rel=1e-4)
