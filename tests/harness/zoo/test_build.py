"""A sample of entries per family builds offline and runs on CPU, deterministically."""

import pytest
import torch

from harness.zoo import BuiltEntry, load_zoo, output_tensors, select

SAMPLE = [
    "transformers/llama/LlamaForCausalLM",  # text, decoder
    "transformers/bert/BertForSequenceClassification",  # text, encoder
    "transformers/t5/T5ForConditionalGeneration",  # seq2seq
    "transformers/vit/ViTForImageClassification",  # vision
    "transformers/whisper/WhisperForConditionalGeneration",  # audio features + decoder
    "transformers/wav2vec2/Wav2Vec2ForCTC",  # waveform
    "transformers/qwen2_vl/Qwen2VLForConditionalGeneration",  # multimodal: image tokens + image_grid_thw
    "transformers/patchtst/PatchTSTForClassification",  # time series
    "diffusers/UNet2DConditionModel",
    "diffusers/FluxTransformer2DModel",
    "diffusers/AutoencoderKL",
]


@pytest.fixture(scope="module")
def full():
    return {e.id: e for e in load_zoo("full")}


@pytest.mark.parametrize("entry_id", SAMPLE)
def test_builds_and_runs_on_cpu(full, entry_id):
    entry = full[entry_id]
    built = entry.build(seed=0)
    assert isinstance(built, BuiltEntry)
    assert 0 < built.num_parameters <= 5_000_000
    assert not built.model.training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in built.model.parameters())
    tensors = output_tensors(built.run())
    assert tensors and all(t.is_floating_point() for t in tensors.values())


def test_same_seed_same_model_inputs_and_outputs(full):
    entry = full["transformers/llama/LlamaForCausalLM"]
    a, b = entry.build(seed=3), entry.build(seed=3)
    assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"])
    assert torch.equal(output_tensors(a.run())["logits"], output_tensors(b.run())["logits"])
    c = entry.build(seed=4)
    assert not torch.equal(output_tensors(a.run())["logits"], output_tensors(c.run())["logits"])


def test_token_ids_stay_inside_the_vocabulary(full):
    built = full["transformers/qwen2_vl/Qwen2VLForConditionalGeneration"].build()
    vocab = built.model.config.get_text_config().vocab_size
    assert int(built.inputs["input_ids"].max()) < vocab
    assert int((built.inputs["input_ids"] == built.model.config.image_token_id).sum()) > 0


def test_pipeline_runs_and_moves_like_a_model(full):
    built = full["diffusers/pipeline/DDPMPipeline"].build(seed=0)
    images = output_tensors(built.run())
    again = output_tensors(built.call(built.model.to("cpu"), built.inputs))  # fresh CPU generator per call
    assert images.keys() == again.keys()
    assert all(torch.equal(images[k], again[k]) for k in images)


def test_over_budget_entry_fails_with_a_reason(monkeypatch, full):
    from harness.zoo import ZooBuildError, budget

    monkeypatch.setattr(budget, "DEFAULT_BUDGET", 1000)
    monkeypatch.setattr("harness.zoo.transformers_zoo.budget.DEFAULT_BUDGET", 1000)
    from harness.zoo import transformers_zoo

    with pytest.raises(ZooBuildError) as info:
        transformers_zoo.instantiate(transformers_zoo.model_class("LlamaModel"),
                                     transformers_zoo.tiny_config("llama"), seed=0, max_params=1000)
    assert info.value.category == "over_budget"


def test_select_sample_by_task(full):
    assert select(full.values(), task="vae", library="diffusers")


def test_failures_carry_a_category(full):
    from harness.zoo.check import check_entry
    from harness.zoo.errors import CATEGORIES

    # DETR's default backbone is a timm model, and timm is not a dependency of hf-tpu.
    result = check_entry(full["transformers/detr/DetrForObjectDetection"])
    assert not result.ok
    assert result.category == "missing_dependency" and result.category in CATEGORIES
    assert "timm" in result.error


def test_overrides_apply(full):
    from harness.zoo.transformers_zoo import tiny_config

    assert tiny_config("xmod").default_language == "en_XX"
    assert tiny_config("gemma3").mm_tokens_per_image == 4


def test_tower_class_gets_its_own_sub_config():
    from harness.zoo.transformers_zoo import config_for_class, model_class, tiny_config

    # Llama4TextModel is listed under model_type llama4 but is built from the text sub-config.
    config = tiny_config("llama4")
    assert config_for_class(model_class("Llama4TextModel"), config) is config.text_config
    assert config_for_class(model_class("Llama4ForConditionalGeneration"), config) is config


def test_sibling_composite_class_takes_the_model_types_config():
    from harness.zoo.transformers_zoo import config_for_class, model_class, tiny_config

    # Gemma3ForConditionalGeneration is listed under shieldgemma2, whose config it accepts as is; it must not be
    # wrapped as the text config of a new (unshrunk) Gemma3Config.
    config = tiny_config("shieldgemma2")
    assert config_for_class(model_class("Gemma3ForConditionalGeneration"), config) is config
