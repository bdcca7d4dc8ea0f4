"""Per-family fixes where generic shrinking is not enough, one row per model_type.

A rule can give constructor arguments for the unshrunk base config (`base`, when the class's own defaults
do not validate), values merged over the shrunk config dict (`config`), attributes set after construction
(`after`), and an input fixer (`inputs`) for models whose forward needs something the generic builders
cannot derive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DELETE = object()  # in `config`: drop the key so the constructor derives it


@dataclass(frozen=True)
class Rule:
    base: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    inputs: Callable[[Any, Any, dict[str, Any], int], dict[str, Any]] | None = None


NO_RULE = Rule()


def _still_images(inputs: dict[str, Any]) -> dict[str, Any]:
    """(batch, frames, c, h, w) -> (batch, c, h, w): the first frame."""
    pixels = inputs.get("pixel_values")
    if pixels is not None and pixels.dim() == 5:
        return {**inputs, "pixel_values": pixels[:, 0]}
    return inputs

def _codebook_rows(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """MusicGen decoders read one token row per codebook: (batch * num_codebooks, seq) audio codes. The
    conditional model gets its codes as decoder_input_ids (the audio prompt, input_values, only replaces
    them) and MusicGen-Melody its melody as (batch, frames, num_chroma) chroma features."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dec = getattr(config, "decoder", None) or config
    k, vocab = dec.num_codebooks, dec.vocab_size
    out = {key: v for key, v in inputs.items() if key != "input_values"}
    key = "decoder_input_ids" if "decoder_input_ids" in inputs else "input_ids"
    batch, seq = inputs[key].shape
    out[key] = torch.randint(0, vocab, (batch * k, seq), generator=g)
    if key == "input_ids" and "attention_mask" in inputs:
        out["attention_mask"] = torch.ones(batch * k, seq, dtype=torch.long)
    if "input_features" in inputs and getattr(config, "num_chroma", None):
        out["input_features"] = torch.rand(batch, 8, config.num_chroma, generator=g)
    return out


def _audio_padding_mask(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """VibeVoice counts audio tokens from the padding mask of the waveform, which it needs even unpadded."""
    import torch

    values = inputs["input_values"]
    return {**inputs, "padding_mask": torch.ones(values.shape[0], values.shape[-1], dtype=torch.long)}


def _conv_hidden_states(channels_key: str, length: int, key: str = "hidden_states"
                        ) -> Callable[[Any, Any, dict[str, Any], int], dict[str, Any]]:
    """Conv-only halves of a codec take (batch, channels, length): a waveform for the encoder, latent
    frames for the decoder."""

    def fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        return {**inputs, key: torch.randn(2, getattr(config, channels_key), length, generator=g)}

    return fix


def _one_audio_token(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Qwen2-Audio expands one audio placeholder per row into the audio features (its processor's legacy
    layout); a prompt without one leaves the features nowhere to go."""
    ids = inputs["input_ids"].clone()
    ids[:, 1] = config.audio_token_index
    return {**inputs, "input_ids": ids}


def _mel_first(frames: int) -> Callable[[Any, Any, dict[str, Any], int], dict[str, Any]]:
    """(batch, mel bins, frames) features with a per-frame mask, for encoders that take that layout without
    a fixed Whisper-style length."""

    def fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
        import torch

        if "input_features" not in inputs:
            return inputs  # a text-only class of the family
        g = torch.Generator().manual_seed(seed)
        mel = (getattr(config, "audio_config", None) or config).num_mel_bins
        out = {**inputs, "input_features": torch.randn(2, mel, frames, generator=g)}
        if "input_features_mask" in inputs:
            out["input_features_mask"] = torch.ones(2, frames, dtype=torch.long)
        return out

    return fix


def _siglip2_patches(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """SigLIP2 (NaFlex) takes images already cut into patches: (batch, patches, channels * patch**2), with a
    mask of the real patches and each image's (rows, cols) patch grid; here a full 4 x 4 grid per image."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vc = getattr(config, "vision_config", None) or config
    dim = vc.num_channels * vc.patch_size ** 2
    return {**inputs, "pixel_values": torch.randn(2, 16, dim, generator=g),
            "pixel_attention_mask": torch.ones(2, 16, dtype=torch.long), "spatial_shapes": torch.tensor([[4, 4]] * 2)}


def _extra_inputs(make: Callable[[Any, dict[str, Any], Any], dict[str, Any]], needs: str, required: bool = True
                  ) -> Callable[[Any, Any, dict[str, Any], int], dict[str, Any]]:
    """An input fixer that adds the tensors `make(config, inputs, generator)` returns, for the classes of the
    family whose forward has a parameter `needs` (without a default, if `required`; the others run without)."""

    def fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
        import inspect

        import torch

        param = inspect.signature(model.forward).parameters.get(needs)
        if param is None or (required and param.default is not inspect.Parameter.empty):
            return inputs
        return {**inputs, **make(config, inputs, torch.Generator().manual_seed(seed))}

    return fix


def _udop_boxes(config: Any, inputs: dict[str, Any], g: Any) -> dict[str, Any]:
    """UDOP embeds every token with its layout box (x0, y0, x1, y1), normalised to [0, 1]."""
    import torch

    corners = torch.rand(*inputs["input_ids"].shape, 2, 2, generator=g).sort(dim=-2).values  # x0 < x1, y0 < y1
    return {"bbox": corners.transpose(-1, -2).reshape(*inputs["input_ids"].shape, 4)}


def _tube_mask(config: Any, inputs: dict[str, Any], g: Any) -> dict[str, Any]:
    """VideoMAE pre-training reconstructs masked tubelets: mask half of them."""
    import torch

    frames = inputs["pixel_values"].shape[1] // config.tubelet_size
    n = frames * (config.image_size // config.patch_size) ** 2
    return {"bool_masked_pos": torch.rand(inputs["pixel_values"].shape[0], n, generator=g) < 0.5}


def _timesfm_context(config: Any, inputs: dict[str, Any], g: Any) -> dict[str, Any]:
    """TimesFM takes (batch, time) whole patches of context, a padding mask and a frequency class."""
    import torch

    length = 4 * config.patch_length
    return {"past_values": torch.randn(2, length, generator=g),
            "past_values_padding": torch.zeros(2, length, dtype=torch.long), "freq": torch.zeros(2, 1, dtype=torch.long)}


def _question_fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Splinter's span selection reads the positions of the question token, one per row at least."""
    ids = inputs["input_ids"].clone()
    ids[:, 2] = config.question_token_id
    return {**inputs, "input_ids": ids}


def _seggpt_prompt(config: Any, inputs: dict[str, Any], g: Any) -> dict[str, Any]:
    """SegGPT segments by example: a prompt image and its mask, shaped like the input image."""
    import torch

    b, c, h, w = inputs["pixel_values"].shape
    shape = (b, c, h // 2, w)  # the model stacks prompt over input: each is half its image_size
    return {"pixel_values": torch.randn(shape, generator=g), "prompt_pixel_values": torch.randn(shape, generator=g),
            "prompt_masks": torch.randn(shape, generator=g)}


def _drop(*keys: str, unless_missing: str) -> Callable[[Any, Any, dict[str, Any], int], dict[str, Any]]:
    """Drop `keys` when `unless_missing` is among the inputs: for models whose forward takes one of two
    alternative inputs (text or speech) and refuses both."""

    def fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
        if unless_missing not in inputs:
            return inputs
        return {k: v for k, v in inputs.items() if k not in keys}

    return fix


def _pop2piano_features(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Pop2Piano's encoder reads the audio features directly as its input embeddings, (batch, frames, d_model),
    in place of text ids."""
    import torch

    if "input_features" not in inputs:
        return inputs
    out = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    out["input_features"] = torch.randn(2, 64, config.d_model, generator=torch.Generator().manual_seed(seed))
    return out


def _text_line_images(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Text-line recognisers pool the 1/32-scale feature map with a (3, 2) window: 96 px high images."""
    import torch

    b, c, _, w = inputs["pixel_values"].shape
    return {**inputs, "pixel_values": torch.randn(b, c, 96, w, generator=torch.Generator().manual_seed(seed))}


_QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
        "indexer_compress_ratio": 4}

RULES: dict[str, Rule] = {
    # X-MOD routes every batch through a language adapter and refuses input without a language.
    "xmod": Rule(config={"default_language": "en_XX"}),
    # Gemma 3 pools the vision tower's patch grid down to mm_tokens_per_image (a square): 4 patches per side
    # at 64 px, so 4 tokens (2 x 2), not the default 256.
    "gemma3": Rule(config={"mm_tokens_per_image": 4}),
    # (ShieldGemma2 also scores its Yes/No vocabulary entries, 10784 and 3771 unless set: inside the shrunk vocab.)
    "shieldgemma2": Rule(config={"mm_tokens_per_image": 4}, after={"yes_token_index": 10, "no_token_index": 11}),
    "t5gemma2": Rule(config={"encoder": {"mm_tokens_per_image": 4}}),
    # EfficientNet's last conv width is round_filters(1280) at the shrunk width coefficient, not hidden_dim.
    "efficientnet": Rule(config={"hidden_dim": 320}),
    # Griffin repeats block_types (recurrent, recurrent, attention): 3 layers keep one attention layer.
    "recurrent_gemma": Rule(config={"num_hidden_layers": 3}),
    # Bamba's default has no attention layer at all, and a cache of only Mamba layers cannot report its length.
    "bamba": Rule(config={"attn_layer_indices": [1]}),
    # Jamba places attention every attn_layer_period layers from attn_layer_offset (8 and 4): none in 2 layers.
    "jamba": Rule(config={"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                          "expert_layer_offset": 1}),
    # ESM's vocabulary comes from its tokenizer (33 amino-acid tokens); the config default is None.
    "esm": Rule(config={"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32}),
    # DAC-style codecs double encoder_hidden_size at each of 4 downsamplings (64 -> 1024 channels).
    "dac": Rule(config={"encoder_hidden_size": 8, "decoder_hidden_size": 64}),
    # BLIP-2-style models scatter Q-Former queries into image placeholders, whose id defaults to None.
    "blip-2": Rule(config={"image_token_index": 1000}),
    "instructblip": Rule(config={"image_token_index": 1000}),
    "instructblipvideo": Rule(config={"video_token_index": 1000}),
    # Perceiver cross-attends from latents to preprocessed inputs whose width (e.g. 261 = 3 + Fourier
    # features) no head count but 1 divides.
    # Its num_frames describes the multimodal autoencoder's video, not the image classifiers' input.
    "perceiver": Rule(config={"num_cross_attention_heads": 1}, inputs=lambda model, config, inputs, seed: _still_images(inputs)),
    # Reformer's axial position embeddings factor the sequence (4 x 4 = 16 tokens) and split hidden (16 + 48).
    "reformer": Rule(config={"axial_pos_embds_dim": [16, 48], "axial_pos_shape": [4, 4], "max_position_embeddings": 16,
                             "lsh_attn_chunk_length": 4, "local_attn_chunk_length": 4, "num_buckets": 2}),
    # MobileBERT's bottleneck widths are separate keys that must follow the shrunk hidden size.
    "mobilebert": Rule(config={"embedding_size": 64, "intra_bottleneck_size": 64, "true_hidden_size": 64}),
    # The decoder's attention reads num_key_value_heads, which only checkpoints' configs carry (no default).
    "moonshine_streaming": Rule(config={"num_key_value_heads": 4}),
    # Muse Glimmer/Spark project pixel-shuffled vision features (vision width * merge_size**2 = 64 * 4) and,
    # for Spark, audio features of the text model's width.
    "muse_glimmer": Rule(config={"out_hidden_size": 256}),
    "muse_spark": Rule(config={"out_hidden_size": 256, "audio_config": {"out_hidden_size": 64}}),
    # MusicGen decoders take one row of audio codes per codebook, not one row of text tokens per sample.
    "musicgen": Rule(inputs=_codebook_rows),
    "musicgen_melody": Rule(inputs=_codebook_rows),
    # The flow head is conditioned on the backbone's hidden states (condition_dim must equal hidden_size).
    "pocket_tts": Rule(config={"flow_head_config": {"condition_dim": 64}}),
    # The decoder half of the codec decodes (batch, hidden_size, frames) latents.
    "pocket_tts_audio_tokenizer_decoder": Rule(inputs=_conv_hidden_states("hidden_size", 8, "latents")),
    # Pop2Piano's encoder reads audio features as its input embeddings, instead of text ids.
    "pop2piano": Rule(inputs=_pop2piano_features),
    # Its detection post-processing keeps boxes above a per-class threshold, given only by checkpoints.
    "pp_doclayout_v2": Rule(config={"class_thresholds": [0.5, 0.5], "class_order": [0, 1]}),
    # The mask branch reads the HGNetV2 backbone's first stage, whose width (128 -> 8) x4_feat_dim repeats.
    "pp_doclayout_v3": Rule(config={"x4_feat_dim": 8}),
    # The text-line recogniser pools its 1/32-scale features with a (3, 2) window: images 96 px high.
    "pp_ocrv5_mobile_rec": Rule(inputs=_text_line_images),
    # The Omni thinkers' M-RoPE index reads vision_start_token_id, which only checkpoints' thinker configs carry.
    "qwen2_5_omni_thinker": Rule(config={"vision_start_token_id": 1000}),
    # Qwen2-Audio expands one audio placeholder per row (its legacy prompt layout).
    "qwen2_audio": Rule(inputs=_one_audio_token),
    # Qwen3-ASR's encoder takes (batch, mel, frames) in whole chunks of 2 * n_window = 100 frames (its
    # per-chunk output length, 13, is fixed in the code, so n_window cannot shrink), and projects into the
    # text model's width (output_dim).
    "qwen3_asr": Rule(config={"audio_config": {"output_dim": 64}}, inputs=_mel_first(200)),
    "qwen3_asr_encoder": Rule(inputs=_mel_first(200)),
    "qwen3_omni_moe_thinker": Rule(config={"vision_start_token_id": 1000}),
    # Qwen4-Exp's "indexed_attention" layers select tokens with a QSA indexer whose sizes default to None
    # (only real checkpoints set them): a small one, budget a multiple of the block size.
    "qwen4_exp": Rule(config={"text_config": _QSA}),
    "qwen4_exp_text": Rule(config=_QSA),
    # SAM adds the image encoder neck (output_channels) and its positional encoding (2 * num_pos_feats) to
    # prompt embeddings of hidden_size; SAM-HQ's mask decoder also reads the encoder's width (vit_dim).
    "sam": Rule(config={"vision_config": {"output_channels": 64, "num_pos_feats": 32}}),
    "sam_hq": Rule(config={"vision_config": {"output_channels": 64, "num_pos_feats": 32},
                           "mask_decoder_config": {"vit_dim": 64}}),
    # Sapiens2's dense-prediction heads are described only by checkpoint configs (no default upsampling stack).
    "sapiens2": Rule(config={"head_config": {"upsample_out_channels": [32, 16], "conv_out_channels": [16]}}),
    # SeamlessM4T's base model translates either text or speech: given speech, the text ids must go.
    "seamless_m4t": Rule(inputs=_drop("input_ids", "attention_mask", unless_missing="input_features")),
    "seamless_m4t_v2": Rule(inputs=_drop("input_ids", "attention_mask", unless_missing="input_features")),
    # SegGPT's image_size is the prompt and the input stacked (2:1, like its 896 x 448 default).
    "seggpt": Rule(config={"image_size": [128, 64]}, inputs=_extra_inputs(_seggpt_prompt, "prompt_pixel_values")),
    # SigLIP2 (NaFlex) takes pre-cut patches with their mask and grid shapes.
    "siglip2": Rule(inputs=_siglip2_patches),
    "siglip2_vision_model": Rule(inputs=_siglip2_patches),
    # Its default encoder (wav2vec2-style) reads the waveform; the filterbank features are the alternative.
    "speech-encoder-decoder": Rule(inputs=_drop("input_features", unless_missing="input_values")),
    # Splinter's pre-training head needs a question token in every row.
    "splinter": Rule(inputs=_question_fix),
    # Step3p7's sliding-attention heads need a window, which the config leaves None.
    "step3p7": Rule(config={"text_config": {"sliding_window": 8}}),
    # TimesFM's base model takes a padding mask and a frequency class with its context.
    "timesfm": Rule(inputs=_extra_inputs(_timesfm_context, "past_values_padding")),
    # UDOP embeds each token with its layout box, and its forward fails without boxes.
    "udop": Rule(inputs=_extra_inputs(_udop_boxes, "bbox", required=False)),
    # VibeVoice counts audio tokens from the waveform's padding mask.
    "vibevoice": Rule(inputs=_audio_padding_mask),
    # The codec's conv halves take (batch, channels, length); 16000 samples are 5 frames of the 3200-sample hop.
    "vibevoice_acoustic_tokenizer_decoder": Rule(inputs=_conv_hidden_states("hidden_size", 8)),
    "vibevoice_acoustic_tokenizer_encoder": Rule(inputs=_conv_hidden_states("channels", 16000)),
    # VideoMAE pre-training reconstructs masked tubelets: it needs the mask.
    "videomae": Rule(inputs=_extra_inputs(_tube_mask, "bool_masked_pos")),
    # Voxtral's audio placeholder id defaults to None (set by checkpoints), so no token could carry audio.
    "voxtral": Rule(config={"audio_token_id": 1000}),
    # Voxtral-Realtime's causal conv encoder takes (batch, mel, frames), and the model adds one audio frame
    # (8 mel frames) to each text token: 128 frames for the 16 tokens.
    "voxtral_realtime": Rule(inputs=_mel_first(128)),
    "voxtral_realtime_encoder": Rule(inputs=_mel_first(128)),
    # xLSTM's cache sizes its state from q/k and v widths rounded up to multiples of 64, the layers from the
    # exact widths (hidden * 0.5 and hidden * 1.0): they agree from hidden 128 on.
    "xlstm": Rule(config={"hidden_size": 128, "embedding_dim": 128}),
    # Zamba ties its shared transformer block across hybrid layers: two hybrid layers leave something to tie.
    "zamba": Rule(config={"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]}),
}


def rule_for(model_type: str) -> Rule:
    return RULES.get(model_type, NO_RULE)
