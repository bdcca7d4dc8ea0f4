"""Deterministic dummy inputs for a model, derived from its config and its forward signature.

One builder per modality (text, seq2seq decoder, vision, video, audio waveform / features, multimodal image
tokens, time series); `build_inputs` calls those whose inputs the forward signature names."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

BATCH = 2
SEQ = 16
DECODER_SEQ = 8
WAVEFORM = 16000  # samples (1 s at 16 kHz): ~50 frames after a conv feature encoder of stride ~320


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def find(config: Any, key: str, subs: tuple[str, ...] = ("vision_config", "text_config", "audio_config",
                                                         "encoder", "backbone_config", "encoder_config",
                                                         "model_config")) -> Any:
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


def layout_boxes(config: Any, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """One (x0, y0, x1, y1) box per token for document-layout models, x0 <= x1 and y0 <= y1, in the 0..1000
    page coordinates their 2-D position embeddings index."""
    top = min(1000, (find(config, "max_2d_position_embeddings") or 1024) - 1)
    corners = torch.randint(0, top + 1, (*shape, 2, 2), generator=g)  # two (x, y) points
    low, high = corners.min(dim=-2).values, corners.max(dim=-2).values
    return torch.cat([low, high], dim=-1)


def decoder_inputs(config: Any, g: torch.Generator) -> dict[str, Any]:
    dec = getattr(config, "decoder", None) or text_config(config)
    return {"decoder_input_ids": random_tokens(dec, (BATCH, DECODER_SEQ), g)}


def vision_inputs(config: Any, model_class: str, g: torch.Generator) -> dict[str, Any]:
    c, h, w = image_hw(config)
    frames = find(config, "num_frames")
    if _is_int(frames):  # video models name their clip length; their pixel_values are (batch, frames, c, h, w)
        return {"pixel_values": torch.randn(BATCH, int(frames), c, h, w, generator=g)}
    return {"pixel_values": torch.randn(BATCH, c, h, w, generator=g)}


def audio_values(config: Any, g: torch.Generator) -> dict[str, Any]:
    mel, frames = find(config, "num_mel_bins"), find(config, "max_length")
    if _is_int(mel) and _is_int(frames):
        # spectrogram transformers (AST) take (batch, frames, mel bins) as input_values
        return {"input_values": torch.randn(BATCH, frames, mel, generator=g)}
    if any(find(config, k) is not None for k in ("audio_channels", "upsampling_ratios", "downsampling_ratios")):
        # neural audio codecs take (batch, channels, samples)
        channels = find(config, "audio_channels") or 1
        return {"input_values": torch.randn(BATCH, int(channels), WAVEFORM, generator=g)}
    return {"input_values": torch.randn(BATCH, WAVEFORM, generator=g)}


def audio_features(config: Any, g: torch.Generator) -> dict[str, Any]:
    mel = find(config, "num_mel_bins")
    positions = find(config, "max_source_positions")
    per_channel = find(config, "input_feat_per_channel")
    if mel and positions:
        # Whisper-style encoders need exactly 2 * max_source_positions frames (conv stride 2).
        return {"input_features": torch.randn(BATCH, mel, 2 * positions, generator=g)}
    if per_channel:
        channels = find(config, "input_channels") or 1
        return {"input_features": torch.randn(BATCH, 64, per_channel * channels, generator=g)}
    # w2v-BERT-style encoders stack frames: their projection input is a multiple of feature_size
    size = find(config, "feature_projection_input_dim") or find(config, "feature_size") or mel or 80
    stacked = find(config, "num_stacked_frames")
    if _is_int(stacked) and mel and size == mel:
        size = mel * stacked  # low-frame-rate features: stacked mel frames (Fun-ASR)
    return {"input_features": torch.randn(BATCH, 64, size, generator=g)}


def time_series_inputs(config: Any, params: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    context = getattr(config, "context_length", None) or 32
    lags = max(getattr(config, "lags_sequence", None) or [0])
    channels = getattr(config, "input_size", None) or getattr(config, "num_input_channels", None) or 1
    length = context + lags
    # (batch, time) for univariate distribution heads, (batch, time, channels) for patch models
    multichannel = channels > 1 or getattr(config, "num_input_channels", None) is not None
    values = torch.randn(BATCH, length, channels, generator=g) if multichannel else torch.randn(BATCH, length, generator=g)
    out: dict[str, Any] = {"past_values": values}
    if "past_time_features" in params:
        out["past_time_features"] = torch.randn(BATCH, length, getattr(config, "num_time_features", 0) or 0, generator=g)
    if "past_observed_mask" in params:
        out["past_observed_mask"] = torch.ones_like(values)
    return out


def decision_inputs(ids: torch.Tensor) -> dict[str, Any]:
    """Decision heads (JEV) score the options of questions asked in one prompt: one question of each type
    (noul, score, choice), marked at a token of the prompt, with a few options each."""
    marks = torch.tensor([[ids.shape[1] // 4, ids.shape[1] // 2, ids.shape[1]]])  # 1-based: the token before
    return {"marks": marks, "num_options": torch.tensor([[2, 3, 4]]), "question_type_ids": torch.tensor([[0, 1, 2]])}


def forward_params(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(model.forward).parameters)


def build_inputs(model: torch.nn.Module, config: Any, model_class: str, seed: int = 0) -> dict[str, Any]:
    """Inputs for one forward of `model`: every modality the forward signature asks for."""
    params = forward_params(model)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    if "input_ids" in params:
        out.update(text_inputs(config, params, model_class, g))
    if "bbox" in params and "input_ids" in out:
        out["bbox"] = layout_boxes(config, out["input_ids"].shape, g)
    derives_decoder = model_class.endswith(("ForSequenceClassification", "ForQuestionAnswering"))
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False) and not derives_decoder:
        out.update(decoder_inputs(config, g))
    if "pixel_values" in params and "image_grid_thw" in params:
        out.update(grid_vision_inputs(config, g))
    elif "grid_thw" in params and ("hidden_states" in params or "pixel_values" in params):
        # a Qwen-VL-style vision tower on its own: flattened patches and their grid
        grid = grid_vision_inputs(config, g)
        key = "hidden_states" if "hidden_states" in params else "pixel_values"
        out.update({key: grid["pixel_values"], "grid_thw": grid["image_grid_thw"]})
    elif "pixel_values" in params:
        out.update(vision_inputs(config, model_class, g))
    grid = getattr(config, "image_grid_pinpoints", None)
    if "image_sizes" in params and getattr(out.get("pixel_values"), "dim", lambda: 0)() == 4 and \
            (grid or _vision_tower_takes(model, "image_sizes")):
        # "any resolution" models and Pixtral towers cut each image to its (height, width) and have no default
        # (a CLIP tower under LLaVA takes no sizes: passing them switches LLaVA to the Pixtral path)
        out["image_sizes"] = torch.tensor([list(out["pixel_values"].shape[-2:])] * BATCH)
        if isinstance(grid, list) and grid:
            # "any resolution" models take (batch, tiles, c, h, w): the base image plus the tiles of the best grid
            from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

            b, c, h, w = out["pixel_values"].shape
            n = image_size_to_num_patches((h, w), grid, h)
            out["pixel_values"] = torch.randn(b, n, c, h, w, generator=g)
    if "pixel_values_videos" in params and "pixel_values" not in params:
        c, h, w = image_hw(config)
        frames = find(config, "num_frames")  # a clip length the model's temporal positions are sized for
        frames = int(frames) if _is_int(frames) and 0 < frames <= 16 else 4
        out["pixel_values_videos"] = torch.randn(BATCH, frames, c, h, w, generator=g)
    if "qformer_input_ids" in params and "input_ids" in out:
        # InstructBLIP's Q-Former reads the instruction too, in its own (BERT) vocabulary
        qformer = getattr(config, "qformer_config", None) or config
        out["qformer_input_ids"] = random_tokens(qformer, (BATCH, SEQ), g)
        out["qformer_attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    if "visual_feats" in params and "visual_pos" in params:
        # LXMERT-style: pre-extracted region features and their boxes
        out["visual_feats"] = torch.randn(BATCH, 8, find(config, "visual_feat_dim") or 2048, generator=g)
        out["visual_pos"] = torch.rand(BATCH, 8, find(config, "visual_pos_dim") or 4, generator=g)
    if {"marks", "num_options", "question_type_ids"} <= params.keys() and "input_ids" in out:
        out.update(decision_inputs(out["input_ids"]))
    if "input_values" in params:
        out.update(audio_values(config, g))
    if "input_features" in params:
        out.update(audio_features(config, g))
    if "latents" in params and getattr(model, "main_input_name", None) == "latents":
        # a neural codec's decoder on its own: continuous latents (batch, hidden_size, frames)
        out["latents"] = torch.randn(BATCH, int(find(config, "hidden_size") or 64), 8, generator=g)
    if "past_values" in params:
        out.update(time_series_inputs(config, params, g))
    if "sample" in params and str(getattr(config, "model_type", "")).startswith("vibevoice") and "input_values" in out:
        # VibeVoice's sigma-VAE adds Gaussian noise to the acoustic latents, drawn on the model's device, by default
        out["sample"] = False
    if "noise" in params and getattr(config, "model_type", "") == "vit_mae" and "pixel_values" in out:
        # ViTMAE draws its random patch mask on the model's device when given no noise: no two devices' random
        # streams agree, so every output differed from the baseline's (Transformers' own tests pass noise too)
        _, h, w = out["pixel_values"].shape[-3:]
        p = int(config.patch_size)
        out["noise"] = torch.rand(BATCH, (h // p) * (w // p), generator=g)
    # a composite built without a tower (Gemma 4's default config has neither vision nor audio) is text-only
    if _built_without(model, "vision_tower", "embed_vision"):
        out = {k: v for k, v in out.items() if not k.startswith(("pixel_values", "image_"))}
    if _built_without(model, "audio_tower", "embed_audio"):
        out.pop("input_features", None)
    for mask in ("feature_attention_mask", "input_features_mask"):
        if mask in params and "input_features" in out:
            feats = out["input_features"]
            out[mask] = torch.ones(feats.shape[0], feats.shape[-1] if feats.shape[1] == find(config, "num_mel_bins")
                                   else feats.shape[1], dtype=torch.long)
    return out


def _built_without(model: torch.nn.Module, *towers: str) -> bool:
    """Whether `model` (or its inner `model`) has one of the attributes `towers` set to None: that modality is
    absent."""
    return any(t in vars(m) and getattr(m, t) is None for m in (model, getattr(model, "model", None))
               if isinstance(m, torch.nn.Module) for t in towers)


def _vision_tower_takes(model: torch.nn.Module, param: str) -> bool:
    """Whether a vision tower inside `model` (vision_tower, vision_encoder...) has `param` in its forward."""
    for name, module in model.named_modules():
        if "vision" in name.rsplit(".", 1)[-1] and param in forward_params(module):
            return True
    return False


def grid_vision_inputs(config: Any, g: torch.Generator, grid: int = 4) -> dict[str, Any]:
    """Qwen-VL-style inputs: flattened patches plus `image_grid_thw` (one 1 x grid x grid image per row)."""
    vc = getattr(config, "vision_config", None) or config
    patch = find(vc, "patch_size") or 14
    temporal = find(vc, "temporal_patch_size") or find(vc, "patch_temporal") or 1
    channels = find(vc, "in_channels") or find(vc, "num_channels") or 3
    merge = find(vc, "spatial_merge_size") or 1
    grid = max(grid, 2 * merge)
    dim = int(channels) * int(temporal) * int(patch) * int(patch)
    return {"pixel_values": torch.randn(BATCH * grid * grid, dim, generator=g),
            "image_grid_thw": torch.tensor([[1, grid, grid]] * BATCH)}


_PLACEHOLDER = re.compile(r"(Image|Video|Audio|Multimodal) features and \w+ tokens do not match[,:] tokens: (\d+), "
                          r"features:? (\d+)")


def placeholder_id(config: Any, kind: str) -> int | None:
    subs = [v for v in vars(config).values() if hasattr(v, "to_dict") and hasattr(v, "model_type")]
    for key in (f"{kind}_token_id", f"{kind}_token_index"):
        for c in (config, text_config(config), *subs):
            v = getattr(c, key, None)
            if _is_int(v):
                return v
    return None


def fit_placeholders(model: torch.nn.Module, config: Any, inputs: dict[str, Any], tries: int = 4) -> dict[str, Any]:
    """Multimodal models need one placeholder token per image/audio feature, a count only the model knows
    (it depends on the vision tower's pooling and merging). Run the model once; when it reports the count
    ("Image features and image tokens do not match, tokens: 0, features: N"), put N placeholder tokens at
    the start of the rows and try again. Any other outcome leaves the inputs as they are."""
    if "input_ids" not in inputs:
        return inputs
    for _ in range(tries):
        try:
            with torch.no_grad():
                model(**inputs)
            return inputs
        except Exception as exc:  # the forward is only a probe here
            m = _PLACEHOLDER.search(str(exc))
            if m and m.group(2) == "0":
                kind = m.group(1).lower()
                if kind == "multimodal":  # the message does not say which: the first modality without placeholders
                    kind = next((k for k in ("image", "video", "audio") if k in _given_modalities(inputs)
                                 and not _has_placeholders(config, inputs, k)), "image")
                token = placeholder_id(config, kind)
                count = int(m.group(3))
                if kind in ("image", "audio"):
                    count = _feature_rows(model, inputs, kind) or count
                if token is None or count % BATCH:
                    return inputs
                inputs = _prefix_tokens(inputs, token, count // BATCH)
                if "mm_token_type_ids" in forward_params(model):
                    inputs["mm_token_type_ids"] = _token_types(config, inputs["input_ids"])
                continue
            if "mm_token_type_ids" in str(exc) and "mm_token_type_ids" not in inputs:
                inputs = {**inputs, "mm_token_type_ids": _token_types(config, inputs["input_ids"])}
                continue
            if "expected 5, got 4" in str(exc) and getattr(inputs.get("pixel_values"), "dim", lambda: 0)() == 4:
                inputs = {**inputs, "pixel_values": inputs["pixel_values"].unsqueeze(1)}  # (batch, images, c, h, w)
                continue
            return inputs
    return inputs


# A (batch, samples) waveform where the model wanted (batch, channels, samples): a conv read it as one unbatched
# (channels=batch, samples) input, or the model indexed or checked a channel dimension.
_WANTS_CHANNELS = re.compile(r"expected input\[1, \d+, \d+\] to have \d+ channels|must be mono, but got \d+|"
                             r"too many indices for tensor of dimension 2")


_WANTS_MULTIPLE = re.compile(r"length (\d+) is not a multiple of (\d+)")


def fit_waveform(model: torch.nn.Module, inputs: dict[str, Any], tries: int = 2) -> dict[str, Any]:
    """Waveform models disagree on (batch, samples) vs (batch, 1, samples), and neither their configs nor
    their docstrings say which reliably; some want whole frames of a hop only their feature extractor knows.
    Run the model once; when the failure says it wanted a channel dimension, add one, and when it names the
    multiple the length must be, pad to it. Any other outcome leaves the inputs as they are."""
    for _ in range(tries):
        values = inputs.get("input_values")
        if not isinstance(values, torch.Tensor) or values.dim() != 2:
            return inputs
        try:
            with torch.no_grad():
                model(**inputs)
            return inputs
        except Exception as exc:  # the forward is only a probe here
            if _WANTS_CHANNELS.search(str(exc)):
                return {**inputs, "input_values": values.unsqueeze(1)}
            m = _WANTS_MULTIPLE.search(str(exc))
            if not (m and int(m.group(1)) == values.shape[-1]):
                return inputs
            multiple = int(m.group(2))
            pad = -values.shape[-1] % multiple  # zero padding, like the feature extractors do
            inputs = {**inputs, "input_values": torch.nn.functional.pad(values, (0, pad))}
    return inputs


def _given_modalities(inputs: dict[str, Any]) -> set[str]:
    kinds = {"pixel_values": "image", "pixel_values_videos": "video", "input_features": "audio", "input_values": "audio"}
    return {kind for key, kind in kinds.items() if key in inputs}


def _has_placeholders(config: Any, inputs: dict[str, Any], kind: str) -> bool:
    token = placeholder_id(config, kind)
    return token is not None and bool((inputs["input_ids"] == token).any())


def _feature_rows(model: torch.nn.Module, inputs: dict[str, Any], kind: str) -> int | None:
    """Rows of image or audio features the model will scatter into placeholders, asked of
    `get_{kind}_features` (some models' mismatch message reports elements or batch rows, not feature rows)."""
    name = f"get_{kind}_features"
    # a head's (*args, **kwargs) wrapper names no inputs: ask the inner model's, which does
    gets = [g for g in (getattr(model, name, None), getattr(getattr(model, "model", None), name, None)) if g]
    named = [g for g in gets if any(p.kind == p.POSITIONAL_OR_KEYWORD for p in inspect.signature(g).parameters.values())]
    get = (named or gets or [None])[0]
    if get is None:
        return None
    params = inspect.signature(get).parameters
    kwargs = {k: v for k, v in inputs.items() if k in params and k != "input_ids"}
    try:
        with torch.no_grad():
            out = get(**kwargs)
    except Exception:
        return None
    feats = getattr(out, "pooler_output", None)
    if feats is None:
        feats = getattr(out, "last_hidden_state", out)
    tensors = feats if isinstance(feats, (list, tuple)) else [feats]
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in tensors):
        return None
    return sum(t.numel() // t.shape[-1] for t in tensors)


def _token_types(config: Any, ids: torch.Tensor) -> torch.Tensor:
    """0 for text, 1 for image and 2 for video placeholders (the processors' convention for M-RoPE)."""
    types = torch.zeros_like(ids)
    for value, kind in ((1, "image"), (2, "video")):
        token = placeholder_id(config, kind)
        if token is not None:
            types[ids == token] = value
    return types


def _prefix_tokens(inputs: dict[str, Any], token: int, n: int) -> dict[str, Any]:
    ids = inputs["input_ids"]
    out = {**inputs, "input_ids": torch.cat([torch.full((ids.shape[0], n), token, dtype=ids.dtype), ids], dim=1)}
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
        out["attention_mask"] = torch.cat([torch.ones(mask.shape[0], n, dtype=mask.dtype), mask], dim=1)
    return out
