"""Entries whose class takes another config than their model_type's, or inputs beyond the usual modalities."""

import torch
from transformers import JevConfig, Qwen3_5TextConfig

from harness.zoo import load_zoo, output_tensors, select
from harness.zoo.inputs import build_inputs
from harness.zoo.transformers_zoo import config_for_class, model_class, tiny_config


def _entry(entry_id):
    (entry,) = select(load_zoo("full"), match=f"^{entry_id}$")
    return entry


def test_text_head_of_a_composite_model_gets_the_text_sub_config():
    config = config_for_class(model_class("Qwen3_5ForCausalLM"), tiny_config("qwen3_5"))
    assert isinstance(config, Qwen3_5TextConfig) and config.hidden_size == 64


def test_head_on_a_whole_model_wraps_its_config():
    config = config_for_class(model_class("JevForDecision"), tiny_config("qwen2"))
    assert isinstance(config, JevConfig)
    assert config.text_config.model_type == "qwen2" and config.hidden_size == config.text_config.hidden_size


def test_decision_head_gets_marked_questions():
    built = _entry("transformers/qwen2/JevForDecision").build(seed=0)
    assert {"marks", "num_options", "question_type_ids"} <= built.inputs.keys()
    assert int(built.inputs["marks"].max()) <= built.inputs["input_ids"].shape[1]
    scores = output_tensors(built.run())
    assert scores and all(torch.isfinite(t).all() for t in scores.values())


def test_inputs_of_a_plain_model_have_no_decision_keys():
    built = _entry("transformers/qwen2/Qwen2ForCausalLM").build(seed=0)
    assert "marks" not in build_inputs(built.model, built.model.config, "Qwen2ForCausalLM")


class _WantsChannels(torch.nn.Module):
    """A conv codec: (batch, 1, samples) only."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 3)

    def forward(self, input_values):
        return self.conv(input_values)


def test_waveform_gets_a_channel_dimension_when_the_model_wants_one():
    from harness.zoo.inputs import fit_waveform

    model = _WantsChannels()
    out = fit_waveform(model, {"input_values": torch.randn(2, 100)})
    assert out["input_values"].shape == (2, 1, 100)
    model.forward = lambda input_values: input_values.sum()  # a model that takes (batch, samples)
    assert fit_waveform(model, {"input_values": torch.randn(2, 100)})["input_values"].shape == (2, 100)


class _WantsFrames(torch.nn.Module):
    """A model that takes whole 300-sample frames and says so."""

    def forward(self, input_values):
        if input_values.shape[-1] % 300:
            raise ValueError(f"`input_values` length {input_values.shape[-1]} is not a multiple of 300.")
        return input_values.sum()


def test_waveform_is_padded_to_the_frame_multiple_the_model_names():
    from harness.zoo.inputs import fit_waveform

    out = fit_waveform(_WantsFrames(), {"input_values": torch.randn(2, 1000)})
    assert out["input_values"].shape == (2, 1200)


def test_composite_config_of_another_family_is_kept():
    # ShieldGemma2 reuses Gemma3ForConditionalGeneration with its own (compatible) config: no wrapping
    config = tiny_config("shieldgemma2")
    assert config_for_class(model_class("Gemma3ForConditionalGeneration"), config) is config
