"""Input builders give each modality the extra tensors its forward has no default for."""

from harness.zoo.inputs import build_inputs
from harness.zoo.transformers_zoo import model_class, tiny_config


def _inputs(model_type: str, cls: str) -> dict:
    config = tiny_config(model_type)
    model = model_class(cls)._from_config(config)
    return build_inputs(model, config, cls)


def test_any_resolution_images_come_as_tiles_with_their_sizes():
    inputs = _inputs("llava_next", "LlavaNextModel")
    assert inputs["pixel_values"].dim() == 5  # (batch, base image + tiles, c, h, w)
    assert inputs["image_sizes"].tolist() == [list(inputs["pixel_values"].shape[-2:])] * 2


def test_image_sizes_only_for_towers_that_take_them():
    assert "image_sizes" in _inputs("mistral3", "Mistral3Model")  # Pixtral tower
    assert "image_sizes" not in _inputs("llava", "LlavaModel")  # CLIP tower


def test_codec_decoder_gets_latents():
    inputs = _inputs("mimi_decoder", "MimiDecoderModel")
    assert inputs["latents"].shape[:2] == (2, tiny_config("mimi_decoder").hidden_size)


def test_layout_models_get_ordered_boxes():
    inputs = _inputs("layoutlm", "LayoutLMModel")
    box = inputs["bbox"]
    assert box.shape == (*inputs["input_ids"].shape, 4)
    assert (box[..., 0] <= box[..., 2]).all() and (box[..., 1] <= box[..., 3]).all() and box.max() <= 1000


def test_low_frame_rate_features_stack_mel_frames():
    config = tiny_config("fun_asr_nano").audio_config
    inputs = _inputs("fun_asr_nano", "FunAsrNanoModel")
    assert inputs["input_features"].shape[-1] == config.num_mel_bins * config.num_stacked_frames


def test_audio_placeholder_rows_come_from_the_inner_model():
    import torch

    from harness.zoo.inputs import _feature_rows

    model = model_class("GraniteSpeechForConditionalGeneration")._from_config(tiny_config("granite_speech")).eval()
    inputs = {"input_features": torch.randn(2, 64, 160)}  # its wrapper's get_audio_features takes **kwargs only
    rows = _feature_rows(model, inputs, "audio")
    assert rows == _feature_rows(model.model, inputs, "audio") and rows > 2


def test_vocabulary_of_a_wrapped_model_config():
    from harness.zoo.inputs import vocab_size

    config = tiny_config("fastspeech2_conformer_with_hifigan")  # the text model's config is `model_config`
    assert vocab_size(config) == config.model_config.vocab_size


def test_no_inputs_for_a_tower_the_model_was_built_without():
    inputs = _inputs("gemma4", "Gemma4Model")  # the default config has neither vision nor audio
    assert "input_ids" in inputs and "pixel_values" not in inputs and "input_features" not in inputs


def test_multimodal_placeholder_message_fills_the_given_modality():
    # dots.3 says "Multimodal features and placeholder tokens do not match" without naming the modality
    from harness.zoo.inputs import fit_placeholders, placeholder_id

    config = tiny_config("dots3_note")
    model = model_class("Dots3NoteModel")._from_config(config).eval()
    inputs = {k: v for k, v in build_inputs(model, config, "Dots3NoteModel").items() if k != "input_features"}
    fitted = fit_placeholders(model, config, inputs)
    assert (fitted["input_ids"] == placeholder_id(config, "image")).sum() > 0


def test_masked_autoencoder_gets_its_mask_noise():
    # without `noise` ViTMAE draws its patch mask from the device's random stream, which no other device repeats
    import torch

    from harness.zoo.transformers_zoo import model_class as cls_of

    config = tiny_config("vit_mae")
    model = cls_of("ViTMAEModel")._from_config(config).eval()
    inputs = build_inputs(model, config, "ViTMAEModel")
    assert inputs["noise"].shape == (2, (config.image_size // config.patch_size) ** 2)
    masks = []
    for seed in (0, 1):  # the global random state no longer decides the mask
        torch.manual_seed(seed)
        with torch.no_grad():
            masks.append(model(**inputs).mask)
    assert torch.equal(masks[0], masks[1])


def test_vibevoice_takes_its_acoustic_latents_without_noise():
    # its sigma-VAE adds Gaussian noise drawn on the model's device by default: no other device draws the same
    assert _inputs("vibevoice", "VibeVoiceForConditionalGeneration")["sample"] is False
