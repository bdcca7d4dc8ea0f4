"""Issue 3, points 1 and 2: from_pretrained onto `tpu` for the Auto classes, device_map forms, dtype,
sharded and .bin checkpoints; logits equal to CPU's within the tolerances in docs/integration.md."""

import json

import pytest
import torch
from _hf_tiny import AUTO_CASES, all_on_tpu, on_tpu, rel_err, save_tiny

HIGHEST_RTOL = 1e-4  # precision "highest": full float32 matmuls
MEDIUM_RTOL = 2e-2  # precision "medium" (tpu's default): bfloat16 multiplies, float32 accumulation

FAST_CASES = ["AutoModel", "ForCausalLM", "ForSequenceClassification", "ForMaskedLM", "ForTokenClassification",
              "ForQuestionAnswering", "ForSeq2SeqLM", "ForImageClassification", "SpeechSeq2Seq-Whisper"]


def _load_pair(case, model_dir, **kw):
    import transformers

    auto, _, inputs, field = AUTO_CASES[case]
    cls = getattr(transformers, auto)
    path = model_dir(case)
    cpu = cls.from_pretrained(path).eval()
    tpu = cls.from_pretrained(path, device_map="tpu", **kw).eval()
    return cpu, tpu, inputs(), field


def _compare(cpu, tpu, x, field):
    with torch.no_grad():
        ref = getattr(cpu(**x), field)
        out = getattr(tpu(**on_tpu(x)), field)
    assert out.device.type == "tpu"
    return rel_err(ref, out)


@pytest.mark.parametrize("case", FAST_CASES + [pytest.param("CTC-Wav2Vec2", marks=pytest.mark.slow)])
def test_auto_class_loads_on_tpu_and_matches_cpu(case, model_dir, highest):
    cpu, tpu, x, field = _load_pair(case, model_dir)
    assert all_on_tpu(tpu), [n for n, p in tpu.named_parameters() if p.device.type != "tpu"]
    assert tpu.device.type == "tpu"
    err = _compare(cpu, tpu, x, field)
    print(f"\n{case}: highest-precision relative error {err:.2e}")
    assert err <= HIGHEST_RTOL


@pytest.mark.parametrize("case", [
    "ForCausalLM", "AutoModel",
    *[pytest.param(c, marks=pytest.mark.slow) for c in AUTO_CASES if c not in ("ForCausalLM", "AutoModel")],
])
def test_medium_precision_within_documented_tolerance(case, model_dir, precision):
    precision("medium")
    cpu, tpu, x, field = _load_pair(case, model_dir)
    err = _compare(cpu, tpu, x, field)
    print(f"\n{case}: medium-precision relative error {err:.2e}")
    assert err <= MEDIUM_RTOL
    assert err > 1e-6, "medium should round matmul inputs to bfloat16 (is the precision emulation on?)"


@pytest.mark.parametrize("device_map", [{"": "tpu:0"}, "tpu:0", "auto", torch.device("tpu")])
def test_device_map_forms(device_map, model_dir, highest):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir("ForCausalLM"), device_map=device_map)
    assert all_on_tpu(model) and model.device == torch.device("tpu", 0)


def test_bfloat16_load(model_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir("ForCausalLM"), device_map="tpu",
                                                              dtype=torch.bfloat16)
    assert all_on_tpu(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.slow
def test_bfloat16_forward(model_dir):
    import transformers

    path = model_dir("ForCausalLM")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="tpu", dtype=torch.bfloat16)
    cpu = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, out = cpu(ids).logits, model(ids.to("tpu")).logits
    assert out.dtype == torch.bfloat16
    assert rel_err(ref, out) <= 5e-2  # two bfloat16 computations, rounded in different orders


def test_sharded_checkpoint(tmp_path, highest):
    import transformers
    from _hf_tiny import llama, token_inputs

    path = save_tiny("AutoModelForCausalLM", llama(), tmp_path, max_shard_size="20KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    cpu = transformers.AutoModelForCausalLM.from_pretrained(path)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    assert all_on_tpu(tpu)
    assert _compare(cpu, tpu, token_inputs(), "logits") <= HIGHEST_RTOL


def test_legacy_bin_checkpoint_loads_with_weights_only(tmp_path, model_dir, monkeypatch, highest):
    import transformers
    from _hf_tiny import token_inputs

    src = model_dir("ForCausalLM")
    cpu = transformers.AutoModelForCausalLM.from_pretrained(src)
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    torch.save(cpu.state_dict(), tmp_path / "pytorch_model.bin")  # the pre-safetensors format

    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert calls and all(w is True for w in calls), calls
    assert all_on_tpu(tpu)
    assert _compare(cpu, tpu, token_inputs(), "logits") <= HIGHEST_RTOL
