"""Deterministic dummy inputs for a model, derived from its config and its forward signature.

One builder per modality (text, seq2seq decoder, vision, video, audio waveform / features, multimodal image
tokens, time series); `build_inputs` calls those whose inputs the forward signature names."""

from __future__ import annotations

import inspect
from typing import Any

import torch

BATCH = 2
SEQ = 16
DECODER_SEQ = 8
WAVEFORM = 4000  # samples: enough frames for conv feature encoders with a total stride of ~320


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def find(config: Any, key: str, subs: tuple[str, ...] = ("vision_config", "text_config", "audio_config",
                                                         "encoder", "backbone_config", "encoder_config")) -> Any:
    """`config.key`, else the first sub-config that has it (None if nowhere)."""
    v = getattr(config, key, None)
    if v is not None:
        return v
    for s in subs:
        sub = getattr(config, s, None)
        if sub is not None and getattr(sub, key, None) is not None:
            return getattr(sub, key)
    return None


def text_config(config: Any) -> Any:
    try:
        return config.get_text_config(decoder=True)
    except Exception:  # some configs' get_text_config rejects the `decoder` argument
        return getattr(config, "text_config", None) or config


def vocab_size(config: Any) -> int:
    v = getattr(text_config(config), "vocab_size", None) or find(config, "vocab_size")
    return v if _is_int(v) and v > 0 else 100


def special_ids(config: Any) -> set[int]:
    """Every token id named by the config (and its text config): ordinary tokens must avoid them."""
    ids: set[int] = set()
    for c in {id(config): config, id(text_config(config)): text_config(config)}.values():
        for k, v in c.to_dict().items():
            if k.endswith(("_token_id", "_token_index")) and _is_int(v):
                ids.add(v)
    return ids


def random_tokens(config: Any, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Token ids inside the vocabulary, avoiding the special ids (placeholders would change the input's
    meaning, e.g. an image token without an image)."""
    vocab = vocab_size(config)
    hi = max(2, min(vocab, 1000))
    lo = 4 if hi > 40 else 0
    specials = special_ids(config)
    pool = torch.tensor([i for i in range(lo, hi) if i not in specials] or [0])
    return pool[torch.randint(0, len(pool), shape, generator=g)]


def image_hw(config: Any) -> tuple[int, int, int]:
    """(channels, height, width) of the images a vision config expects."""
    vc = getattr(config, "vision_config", None) or getattr(config, "backbone_config", None) or config
    c = find(vc, "num_channels") or find(config, "num_channels") or 3
    size = find(vc, "image_size") or find(config, "image_size") or 64
    if isinstance(size, (list, tuple)):
        h, w = int(size[-2]), int(size[-1])
    elif isinstance(size, dict):
        h, w = int(size.get("height", 64)), int(size.get("width", 64))
    else:
        h = w = int(size)
    return (int(c) if _is_int(c) else 3), min(h, 256), min(w, 256)


def text_inputs(config: Any, params: dict[str, Any], model_class: str, g: torch.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shape = (BATCH, 2, SEQ) if "MultipleChoice" in model_class else (BATCH, SEQ)
    ids = random_tokens(config, shape, g)
    eos = getattr(text_config(config), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if _is_int(eos) and 0 <= eos < vocab_size(config):
        ids[..., -1] = eos  # like a real tokenizer; encoder-decoder classification heads pool at the EOS
    out["input_ids"] = ids
    if "attention_mask" in params:
        out["attention_mask"] = torch.ones(shape, dtype=torch.long)
    return out


def decoder_inputs(config: Any, g: torch.Generator) -> dict[str, Any]:
    dec = getattr(config, "decoder", None) or text_config(config)
    return {"decoder_input_ids": random_tokens(dec, (BATCH, DECODER_SEQ), g)}


def vision_inputs(config: Any, model_class: str, g: torch.Generator) -> dict[str, Any]:
    c, h, w = image_hw(config)
    frames = find(config, "num_frames")
    if _is_int(frames) and ("Video" in model_class or "video" in getattr(config, "model_type", "")):
        return {"pixel_values": torch.randn(BATCH, int(frames), c, h, w, generator=g)}
    return {"pixel_values": torch.randn(BATCH, c, h, w, generator=g)}


def audio_values(config: Any, g: torch.Generator) -> dict[str, Any]:
    return {"input_values": torch.randn(BATCH, WAVEFORM, generator=g)}


def audio_features(config: Any, g: torch.Generator) -> dict[str, Any]:
    mel = find(config, "num_mel_bins")
    positions = find(config, "max_source_positions")
    per_channel = find(config, "input_feat_per_channel")
    if mel and positions and getattr(config, "model_type", "") in ("whisper",) or (mel and positions and
                                                                                 "whisper" in str(type(config))):
        # Whisper-style encoders need exactly 2 * max_source_positions frames (conv stride 2).
        return {"input_features": torch.randn(BATCH, mel, 2 * positions, generator=g)}
    if per_channel:
        channels = find(config, "input_channels") or 1
        return {"input_features": torch.randn(BATCH, 64, per_channel * channels, generator=g)}
    size = find(config, "feature_size") or mel or 80
    return {"input_features": torch.randn(BATCH, 64, size, generator=g)}


def time_series_inputs(config: Any, params: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    context = getattr(config, "context_length", None) or 32
    lags = max(getattr(config, "lags_sequence", None) or [0])
    channels = getattr(config, "input_size", None) or getattr(config, "num_input_channels", None) or 1
    length = context + lags
    values = torch.randn(BATCH, length, channels, generator=g) if channels > 1 else torch.randn(BATCH, length, generator=g)
    out: dict[str, Any] = {"past_values": values}
    if "past_time_features" in params:
        out["past_time_features"] = torch.randn(BATCH, length, getattr(config, "num_time_features", 0) or 0, generator=g)
    if "past_observed_mask" in params:
        out["past_observed_mask"] = torch.ones_like(values)
    return out


def forward_params(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(model.forward).parameters)


def build_inputs(model: torch.nn.Module, config: Any, model_class: str, seed: int = 0) -> dict[str, Any]:
    """Inputs for one forward of `model`: every modality the forward signature asks for."""
    params = forward_params(model)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    if "input_ids" in params:
        out.update(text_inputs(config, params, model_class, g))
    derives_decoder = model_class.endswith(("ForSequenceClassification", "ForQuestionAnswering"))
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False) and not derives_decoder:
        out.update(decoder_inputs(config, g))
    if "pixel_values" in params:
        out.update(vision_inputs(config, model_class, g))
    if "pixel_values_videos" in params and "pixel_values" not in params:
        c, h, w = image_hw(config)
        out["pixel_values_videos"] = torch.randn(BATCH, 4, c, h, w, generator=g)
    if "input_values" in params:
        out.update(audio_values(config, g))
    if "input_features" in params:
        out.update(audio_features(config, g))
    if "past_values" in params:
        out.update(time_series_inputs(config, params, g))
    return out
