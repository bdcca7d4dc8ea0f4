"""Per-family fixes where generic shrinking is not enough, one row per model_type.

A rule can give constructor arguments for the unshrunk base config (`base`, when the class's own defaults
do not validate), values merged over the shrunk config dict (`config`), attributes set after construction
(`after`), and an input fixer (`inputs`) for models whose forward needs something the generic builders
cannot derive."""

from __future__ import annotations

import inspect
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


def _without(inputs: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in inputs.items() if k != key}


def _audio_features(width: int | None = None, frames: int = 64, mel_first: bool = False) -> Callable[
        [Any, Any, dict[str, Any], int], dict[str, Any]]:
    """`input_features` of `width` features per frame (default: the generic builder's), frames or features first,
    for encoders whose input width or layout the config does not name; a frame mask follows."""

    def fix(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        w = width or inputs["input_features"].shape[-1]
        shape = (2, w, frames) if mel_first else (2, frames, w)
        out = {**inputs, "input_features": torch.randn(*shape, generator=g)}
        if "input_features_mask" in inputs:
            out["input_features_mask"] = torch.ones(2, frames, dtype=torch.long)
        return out

    return fix


def _kosmos2_image_positions(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Kosmos-2 writes its latent_query_num image embeddings where image_embeds_position_mask is 1: after the
    first token, as its processor lays out <s> <image> [queries] </image> text."""
    import torch

    ids = inputs["input_ids"]
    n = config.latent_query_num
    ids = torch.cat([ids[:, :1], torch.zeros(ids.shape[0], n, dtype=ids.dtype), ids[:, 1:]], dim=1)
    mask = torch.zeros_like(ids)
    mask[:, 1:1 + n] = 1
    out = {**inputs, "input_ids": ids, "image_embeds_position_mask": mask}
    if "attention_mask" in inputs:
        out["attention_mask"] = torch.ones_like(ids)
    return out


def _idefics_images(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """IDEFICS takes (batch, images, c, h, w) and which text tokens see which image: one image per row."""
    import torch

    ids = inputs["input_ids"]
    return {**inputs, "pixel_values": inputs["pixel_values"].unsqueeze(1),
            "image_attention_mask": torch.ones(ids.shape[0], ids.shape[1], 1, dtype=torch.long)}


def _tiles(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Granite Docling takes (batch, tiles, c, h, w) and which tiles are real: one real tile per row."""
    import torch

    pixels = inputs["pixel_values"].unsqueeze(1)
    return {**inputs, "pixel_values": pixels, "pixel_attention_mask": torch.ones(pixels.shape[:2], dtype=torch.bool)}


def _image_pairs(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Keypoint matchers take a pair of images per row: (batch, 2, c, h, w), here an image and its flip."""
    import torch

    pixels = inputs["pixel_values"]
    return {**inputs, "pixel_values": torch.stack([pixels, pixels.flip(-1)], dim=1)}


def _mllama_tiles(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Mllama's vision tower takes (batch, images, tiles, c, h, w) with each image's aspect-ratio id (1: one
    tile, 1 x 1) and a mask of its real tiles: one single-tile image per row."""
    import torch

    pixels = inputs.get("pixel_values")
    if pixels is None:  # the text model alone
        return inputs
    b = pixels.shape[0]
    tiles = (getattr(config, "vision_config", None) or config).max_num_tiles
    full = torch.zeros(b, 1, tiles, *pixels.shape[1:])
    full[:, 0, 0] = pixels
    mask = torch.zeros(b, 1, tiles, dtype=torch.long)
    mask[:, 0, 0] = 1
    out = {**inputs, "pixel_values": full, "aspect_ratio_ids": torch.ones(b, 1, dtype=torch.long),
           "aspect_ratio_mask": mask}
    if "input_ids" in inputs:  # every text token may attend to the image's one real tile
        out["cross_attention_mask"] = mask[:, None].expand(b, inputs["input_ids"].shape[1], 1, tiles).clone()
    return out


def _high_res_images(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """DeepSeek-VL hybrid sees each image twice: at the low-res tower's size and at the SAM tower's."""
    import torch

    g = torch.Generator().manual_seed(seed)
    size = config.high_res_vision_config.image_size
    b, c = inputs["pixel_values"].shape[:2]
    return {**inputs, "high_res_pixel_values": torch.randn(b, c, size, size, generator=g)}


def _image_sizes(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Each image's (height, width), for models that cut padded images back to their size."""
    import torch

    pixels = inputs.get("pixel_values")
    if pixels is None:  # the text model alone
        return inputs
    return {**inputs, "image_sizes": torch.tensor([list(pixels.shape[-2:])] * pixels.shape[0])}


def _apertus_inputs(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Apertus 1.5 tokenizes images cut back to their sizes and audio up to each clip's length (its padding mask)."""
    import torch

    out = _image_sizes(model, config, inputs, seed)
    if "input_values" in inputs:
        values = inputs["input_values"]
        out["padding_mask"] = torch.ones(values.shape[0], values.shape[-1], dtype=torch.long)
    return out


def _blip_question_answers(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """BLIP's VQA head decodes an answer: inference passes the answer decoder's input ids."""
    import torch

    if "decoder_input_ids" in inputs or "decoder_input_ids" not in inspect.signature(model.forward).parameters:
        return inputs
    g = torch.Generator().manual_seed(seed)
    vocab = config.text_config.vocab_size
    return {**inputs, "decoder_input_ids": torch.randint(4, vocab, (inputs["input_ids"].shape[0], 8), generator=g)}


def _qformer_queries(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """A Q-Former on its own: learned query embeddings cross-attending to (here random) image features."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {**inputs, "query_embeds": torch.randn(2, 8, config.hidden_size, generator=g),
            "encoder_hidden_states": torch.randn(2, 16, config.encoder_hidden_size, generator=g)}


def _longformer_separators(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Longformer's QA heads put global attention on the question, found as the tokens before the first of three
    separators: <s> question </s></s> context </s>."""
    ids = inputs["input_ids"].clone()
    sep = config.sep_token_id
    ids[ids == sep] = sep + 1
    ids[..., 4] = ids[..., 5] = ids[..., -1] = sep
    return {**inputs, "input_ids": ids}


def _patch_images(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Flattened patches (n, c * p * p) as (n, c, p, p) patch images, for towers that embed them with a conv."""
    vision = getattr(config, "vision_config", None) or config
    patch = vision.patch_size
    pixels = inputs["pixel_values"]
    return {**inputs, "pixel_values": pixels.reshape(pixels.shape[0], -1, patch, patch)}


def _csm_audio(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """CSM encodes each row's audio clips (batch, channels, samples) up to their cutoffs, one clip per row here,
    into the audio placeholder tokens of the row."""
    import torch

    values = inputs["input_values"]
    values = values.unsqueeze(1) if values.dim() == 2 else values
    b = values.shape[0]
    with torch.no_grad():  # one audio placeholder token per codec frame of the clip
        frames = model.codec_model.encode(values[:1]).audio_codes.shape[-1]
    ids = torch.cat([torch.full((b, frames), config.audio_token_id, dtype=inputs["input_ids"].dtype),
                     inputs["input_ids"]], dim=1)
    return {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids), "input_values": values,
            "input_values_cutoffs": torch.tensor([[values.shape[-1]]] * b)}


def _text_and_codes(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Kyutai STT reads one text token and one code per audio codebook at each step: (batch, seq, 1 + codebooks)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = inputs["input_ids"]
    codes = torch.randint(0, config.codebook_vocab_size - 1, (*ids.shape, config.num_codebooks), generator=g)
    return {**inputs, "input_ids": torch.cat([ids.unsqueeze(-1), codes], dim=-1)}


def _merged_patch_images(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Inkling 2 takes one (p * m, p * m, c) pixel block per language-model image token (m x m merged patches),
    with image grids counted in those tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vision = getattr(config, "vision_config", None) or config
    p, m, c = vision.patch_size, vision.spatial_merge_size, vision.num_channels
    grid = inputs["image_grid_thw"].clone()
    grid[:, 1:] //= m
    tokens = int(grid.prod(dim=-1).sum())
    return {**inputs, "pixel_values": torch.rand(tokens, p * m, p * m, c, generator=g) * 2 - 1, "image_grid_thw": grid}


def _gemma3n_mel(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Gemma 3n's audio encoder takes (batch, frames, input_feat_size) mels and a padding mask (True = padding)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {**inputs, "audio_mel": torch.randn(2, 64, config.input_feat_size, generator=g),
            "audio_mel_mask": torch.zeros(2, 64, dtype=torch.bool)}


def _trajectories(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """A Decision Transformer reads (return-to-go, state, action) triples with their timesteps."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b, t = 2, 8
    return {**inputs, "states": torch.randn(b, t, config.state_dim, generator=g),
            "actions": torch.randn(b, t, config.act_dim, generator=g), "rewards": torch.randn(b, t, 1, generator=g),
            "returns_to_go": torch.randn(b, t, 1, generator=g), "timesteps": torch.arange(t).repeat(b, 1),
            "attention_mask": torch.ones(b, t, dtype=torch.long)}


def _gemma4_patches(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Gemma 4's vision tower takes flattened patches with their (x, y) grid positions; a side of 2 pooling
    kernels gives whole pooling windows."""
    import torch

    g = torch.Generator().manual_seed(seed)
    side, patch = 2 * config.pooling_kernel_size, config.patch_size
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
    return {**inputs, "pixel_values": torch.randn(2, side * side, 3 * patch * patch, generator=g),
            "pixel_position_ids": positions.repeat(2, 1, 1)}


def _packed_patches(model: Any, config: Any, inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    """MiniCPM's vision towers take the patches of all images packed into one (1, c, p, patches * p) strip,
    each image's patch grid given by target_sizes."""
    import torch

    pixels = inputs["pixel_values"]
    b, c, h, w = pixels.shape
    p = config.patch_size
    strip = pixels.view(b, c, h // p, p, w // p, p).permute(1, 3, 0, 2, 4, 5).reshape(1, c, p, -1)
    return {**inputs, "pixel_values": strip, "target_sizes": torch.tensor([[h // p, w // p]] * b)}


def _chameleon_vocab(codes: int, first: int) -> dict[str, int]:
    """Chameleon's BPE names for VQ codes: IMGIMG + the code's digits as letters (0 -> A) + Z."""
    names = {f"IMGIMG{''.join(chr(ord('A') + int(d)) for d in str(i))}Z": first + i for i in range(codes)}
    return {"<image>": first - 1, **names}


def _emu3_vocab(codes: int, first: int) -> dict[str, int]:
    names = {f"<|visual token {i:06d}|>": first + i for i in range(codes)}
    return {"<image>": first - 2, "<|extra_200|>": first - 1, **names}


_FOUR_STAGES = ["stage1", "stage2", "stage3", "stage4"]
_COMPASS_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}


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
    # ALIGN compares text embeddings with the EfficientNet tower's last block output (320 channels x the 0.25
    # width coefficient), not with a projection of it.
    "align": Rule(config={"projection_dim": 80}),
    # Apertus 1.5 lays out one vocabulary as text, then image codes, then audio codes: shrink the codebooks so
    # both ranges fit the 1024 tokens, with the placeholders in the text range as in the real layout.
    "apertus1p5": Rule(config={"vision_config": {"codebook_size": 256}, "audio_config": {"codebook_size": 256},
                               "image_token_offset": 512, "audio_token_offset": 768, "image_token_id": 500,
                               "audio_token_id": 501}, inputs=_apertus_inputs),
    # Aria's projector maps a known number of image patches to a number of queries (1225 or 4900 patches at its
    # real sizes): the 2 x 2 patches of the shrunk tower to 4 queries.
    "aria": Rule(config={"projector_patch_to_query_dict": {4: 4}}),
    # Bamba's default has no attention layer at all, and a cache of only Mamba layers cannot report its length.
    "bamba": Rule(config={"attn_layer_indices": [1]}),
    # BEiT-style segmentation reads exactly 4 encoder layers (out_indices, [3, 5, 7, 11] of 12): 4 layers, all read.
    "beit": Rule(config={"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4], "out_features": _FOUR_STAGES,
                         "stage_names": ["stem"] + _FOUR_STAGES}),
    # BiT normalises with GroupNorm(32) everywhere, down to the bottleneck's width / 4: keep stages >= 128 wide.
    "bit": Rule(config={"hidden_sizes": [128, 256, 512, 1024], "embedding_size": 64}),
    # BLIP's VQA head decodes an answer and needs its decoder input at inference.
    "blip": Rule(inputs=_blip_question_answers),
    # BLIP-2-style models scatter Q-Former queries into image placeholders, whose id defaults to None.
    "blip-2": Rule(config={"image_token_index": 1000}),
    # A Q-Former on its own has no images: it needs its queries and the image features to attend to.
    "blip_2_qformer": Rule(inputs=_qformer_queries),
    # BROS adds projected box embeddings to each attention head: the projection width is the head dim (64 / 4).
    "bros": Rule(config={"dim_bbox_projection": 16}),
    # Chameleon maps VQ codes to BPE tokens through the tokenizer's vocabulary (vocabulary_map, None in the default
    # config): 256 codes at ids 512-767, the image placeholder just before.
    "chameleon": Rule(config={"vq_config": {"num_embeddings": 256}, "vocabulary_map": _chameleon_vocab(256, 512),
                              "image_token_id": 511}),
    # Cohere Compass reads RoPE per layer type and its default config has none (checkpoints set it): one M-RoPE
    # for full attention, its (t, h, w) sections summing to half the shrunk head dim.
    "cohere_compass": Rule(config={"text_config": {"rope_parameters": _COMPASS_ROPE}}),
    "cohere_compass_text": Rule(config={"rope_parameters": _COMPASS_ROPE}),
    # CSM's codec encodes audio clips up to per-row cutoffs, which have no default.
    "csm": Rule(inputs=_csm_audio),
    # CvT indexes each stage's drop-path schedule (depth[i] long) by the stage number: depth[i] > i.
    "cvt": Rule(config={"depth": [1, 2, 3]}),
    # DAC-style codecs double encoder_hidden_size at each of 4 downsamplings (64 -> 1024 channels).
    "dac": Rule(config={"encoder_hidden_size": 8, "decoder_hidden_size": 64}),
    # data2vec-vision is BEiT: its segmentation head also reads 4 encoder layers.
    "data2vec-vision": Rule(config={"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]}),
    # DBRX attention reads rope_theta from attn_config, where checkpoints (not the default config) put it, and
    # clamps q/k/v with clip_qkv, which must be set (8 in the released checkpoints).
    "dbrx": Rule(config={"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}}),
    # The Decision Transformer reads trajectories (states, actions, returns), not tokens.
    "decision_transformer": Rule(inputs=_trajectories),
    # DeepSeek-OCR 2's text config leaves its per-layer dense/MoE choice to checkpoints: one of each.
    # Its SAM encoder downsamples to the vision encoder's width (896 -> the shrunk 64).
    "deepseek_ocr2": Rule(config={"text_config": {"mlp_layer_types": ["dense", "sparse"]},
                                  "vision_config": {"sam_config": {"downsample_channels": [64, 64]}}}),
    # DeepSeek-VL hybrid's high-resolution SAM tower widens its 256-channel neck x2 and x4 (to 1024), and its
    # output also takes the hidden state of the first global-attention layer (2 of 12): layer 1 of 2.
    "deepseek_vl_hybrid": Rule(config={"high_res_vision_config": {"output_channels": 64, "global_attn_indexes": [1]}},
                               inputs=_high_res_images),
    # Diffusion Gemma's text config leaves its MoE sizes to checkpoints.
    "diffusion_gemma": Rule(config={"text_config": {"num_experts": 4, "top_k_experts": 2,
                                                     "moe_intermediate_size": 64}}),
    # Dory splits its layers into input, recurrent and output blocks whose sizes must add up; its dict form counts
    # an attention and an mlp block per layer (twice the layers), with the attention kind then "mlp" in layer_types.
    "dory": Rule(config={"num_hidden_layers": 6, "n_input_layers": 2, "n_recurrent_layers": 2, "n_output_layers": 2,
                         "layer_types": ["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention",
                                         "mlp"]}),
    # dots.llm1's config leaves its MoE sizes to checkpoints.
    "dots1": Rule(config={"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2}),
    # dots.3 sliding layers override head_dim to qk_nope + qk_rope (256 = 192 + 64), which the shrunk global
    # head_dim no longer is: 16 + 16.
    # Its audio input also needs the processor's per-chunk sample lengths: run it on text and images only.
    "dots3_note": Rule(config={"text_config": {"per_layer_config": {"01": {"head_dim": 32}}}},
                       inputs=lambda model, config, inputs, seed: _without(inputs, "input_features")),
    "dots3_note_text": Rule(config={"per_layer_config": {"01": {"head_dim": 32}}}),
    # EfficientLoFTR's RepVGG stages list every block's widths (14 blocks of 256 in the last stage), and its
    # hidden size must be the last stage's: one block per stage, 16 to 64 wide. Its 2-D RoPE spans 4 head dims
    # (partial_rotary_factor 4) and must fill hidden / 2 channels: 8 heads as in the default. It matches pairs.
    "efficientloftr": Rule(config={"stage_num_blocks": [1, 1, 1, 1], "out_features": [16, 16, 32, 64],
                                   "stage_in_channels": [1, 16, 16, 32], "stage_block_stride": [[2], [1], [2], [2]],
                                   "stage_block_out_channels": [[16], [16], [32], [64]],
                                   "stage_block_in_channels": [[1], [16], [16], [32]], "hidden_size": 64,
                                   "fine_fusion_dims": [64, 32, 16], "num_attention_heads": 8,
                                   "num_key_value_heads": 8}, inputs=_image_pairs),
    # EfficientNet's last conv width is round_filters(1280) at the shrunk width coefficient, not hidden_dim.
    "efficientnet": Rule(config={"hidden_dim": 320}),
    # Emu3 maps VQ codes to BPE tokens through the tokenizer's vocabulary (vocabulary_map, None in the default
    # config): 256 codes at ids 512-767, the image placeholder and end-of-line token just before. Its VQ attention
    # width is the deepest level's channels (base_channels 32 x 4).
    "emu3": Rule(config={"vq_config": {"codebook_size": 256, "hidden_size": 128},
                         "vocabulary_map": _emu3_vocab(256, 512),
                         "image_token_id": 510}, inputs=_image_sizes),
    # ERNIE 4.5 VL interleaves the h and w rotary sections, which must be equal ([22, 22, 20] by default; the
    # generic M-RoPE default is t first): h, w, t summing to half the shrunk head dim.
    "ernie4_5_vl_moe": Rule(config={"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                                        "mrope_section": [2, 2, 4]}}}),
    # ESM's vocabulary comes from its tokenizer (33 amino-acid tokens); the config default is None.
    "esm": Rule(config={"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32}),
    # FLAVA pretraining computes its losses by default (return_loss), which needs the processor's codebook
    # pixels for masked-image labels: run it as inference.
    "flava": Rule(config={"return_loss": False}),
    # Florence-2 projects image features to the language model's width (1024 = d_model in both defaults).
    "florence2": Rule(config={"vision_config": {"projection_dim": 64}}),
    # Fun-ASR's adaptor bottleneck is a quarter of the LLM width.
    "fun_asr_nano": Rule(config={"adaptor_config": {"intermediate_size": 16}}),
    # Gemma 3 pools the vision tower's patch grid down to mm_tokens_per_image (a square): 4 patches per side
    # at 64 px, so 4 tokens (2 x 2), not the default 256.
    "gemma3": Rule(config={"mm_tokens_per_image": 4}),
    # Gemma 3n's audio encoder on its own names its inputs audio_mel / audio_mel_mask, not input_features.
    "gemma3n_audio": Rule(inputs=_gemma3n_mel),
    # Gemma 3n's last num_kv_shared_layers reuse the KV of earlier layers of the same type: 2 of 4 layers, so that
    # both types (sliding, full) still produce a cache.
    "gemma3n_text": Rule(config={"num_hidden_layers": 4, "num_kv_shared_layers": 2, "intermediate_size": 128,
                                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                                 "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]}),
    # The Gemma 4 assistant drafts without per-layer inputs, but its text config defaults to having them.
    "gemma4_assistant": Rule(base={"text_config": {"hidden_size_per_layer_input": 0,
                                                    "vocab_size_per_layer_input": 0}}),
    # Gemma 4's audio tower subsamples 128 mel bins (a feature-extractor setting, not in the config) by 4.
    "gemma4_audio": Rule(inputs=_audio_features(128)),
    # Gemma 4's vision tower on its own takes flattened patches and their positions, not images.
    "gemma4_vision": Rule(inputs=_gemma4_patches),
    # GLM-ASR's Whisper-style encoder takes (batch, mel bins, frames) without a fixed length.
    "glmasr": Rule(inputs=_audio_features(mel_first=True)),
    "glmasr_encoder": Rule(inputs=_audio_features(mel_first=True)),
    # Granite Docling takes image tiles with a mask of the real ones, and has no default for the mask.
    "granite_docling": Rule(inputs=_tiles),
    # Granite Speech's input_features_mask selects projected audio embeddings (a boolean mask over the
    # projector's output, not over frames); without it every embedding is used.
    "granite_speech": Rule(inputs=lambda model, config, inputs, seed: _without(inputs, "input_features_mask")),
    # Granite Speech 5 delta-expands (x2) and pair-stacks (x2) its mel frames: 4 x num_mel_bins features.
    "granite_speech5_ctc": Rule(inputs=_audio_features(320)),
    "granite_speech5_encoder": Rule(inputs=_audio_features(320)),
    # Granite Speech Plus masks its projected audio embeddings like Granite Speech.
    "granite_speech_plus": Rule(inputs=lambda model, config, inputs, seed: _without(inputs, "input_features_mask")),
    # Granite 4 hybrid's default is all Mamba layers, and a cache of only Mamba layers cannot report its length.
    "granitemoehybrid": Rule(config={"layer_types": ["linear_attention", "full_attention"]}),
    # Hiera's MAE pretraining decoder has no default size.
    "hiera": Rule(config={"decoder_hidden_size": 32, "decoder_depth": 1, "decoder_num_heads": 1}),
    # HRM's num_hidden_layers counts cache slots, one per layer pass: layers per stack x H_cycles x (L_cycles + 1)
    # (16 x 2 x 4 = 128 by default), so with 2 layers per stack it is 16.
    "hrm_text": Rule(config={"num_hidden_layers": 16}),
    # IDEFICS cross-attends to a list of images per row, with a text-to-image mask and no default for it.
    "idefics": Rule(inputs=_idefics_images),
    # Inkling 2 reads pixel blocks per image token, not flattened patches.
    "inkling2": Rule(inputs=_merged_patch_images),
    "inkling2_loop": Rule(inputs=_merged_patch_images),
    "inkling2_vision": Rule(inputs=_merged_patch_images),
    # InstructBLIP(-Video) scatter Q-Former queries into placeholders like BLIP-2; the ids default to None.
    "instructblip": Rule(config={"image_token_index": 1000}),
    "instructblipvideo": Rule(config={"video_token_index": 1000}),
    # Jamba places attention every attn_layer_period layers from attn_layer_offset (8 and 4): none in 2 layers.
    "jamba": Rule(config={"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                          "expert_layer_offset": 1}),
    # Kimi K2.5's vision tower embeds (n, c, p, p) patch images with a conv.
    "kimi_k25": Rule(inputs=_patch_images),
    "kimi_k25_vision": Rule(inputs=_patch_images),
    # Kosmos-2 writes image embeddings only where its position mask says, and has no default mask.
    "kosmos-2": Rule(inputs=_kosmos2_image_positions),
    # Kyutai speech-to-text steps over a text token plus one code per audio codebook.
    "kyutai_speech_to_text": Rule(inputs=_text_and_codes),
    # LFM2-MoE leaves its conv/attention layer pattern to checkpoints: one of each.
    "lfm2_moe": Rule(config={"layer_types": ["conv", "full_attention"]}),
    # LightGlue matches keypoints between two images: it takes pairs.
    "lightglue": Rule(inputs=_image_pairs),
    # LiLT's layout stream splits hidden_size into 6 box embeddings (hidden // 6 each): 96 divides by 6 and 4 heads.
    "lilt": Rule(config={"hidden_size": 96}),
    # Llama 4's vision adapter pixel-shuffles the tower's output (hidden / 0.5^2 = 4 x 64 channels) into an MLP whose
    # input width is the tower's intermediate_size.
    "llama4": Rule(config={"vision_config": {"intermediate_size": 256}}),
    # Longformer's QA and multiple-choice heads find the question by its separator tokens (three per row).
    "longformer": Rule(inputs=_longformer_separators),
    # LW-DETR's default config has no multi-scale projector (checkpoints define it): one level from the ViT
    # backbone's 4 outputs.
    "lw_detr": Rule(config={"projector_scale_factors": [1.0], "projector_in_channels": [64, 64, 64, 64],
                            "projector_out_channels": 64, "num_feature_levels": 1}),
    # MiniCPM's vision towers take the patches of all images packed into one strip, with each image's grid.
    "minicpm_ocr_vision": Rule(inputs=_packed_patches),
    "minicpmv4_7_vision": Rule(inputs=_packed_patches),
    # Mllama concatenates the vision output with intermediate layers' (indices up to 30) into vision_output_dim,
    # and its text model cross-attends at fixed layer indices (3, 8, ...): one of each in the 2-layer towers.
    "mllama": Rule(config={"vision_config": {"intermediate_layers_indices": [1], "vision_output_dim": 128},
                           "text_config": {"cross_attention_layers": [1]}}, inputs=_mllama_tiles),
    # MobileBERT's bottleneck widths are separate keys that must follow the shrunk hidden size.
    "mobilebert": Rule(config={"embedding_size": 64, "intra_bottleneck_size": 64, "true_hidden_size": 64}),
    # Molmo 2 concatenates features of two vision layers (24 and 18 of 27): the last two of the shrunk tower.
    "molmo2": Rule(config={"adapter_config": {"vision_feature_layer": [-1, -2]}}),
    # Moonshine Streaming's decoder attention reads num_key_value_heads, which only checkpoints' configs carry (no default).
    "moonshine_streaming": Rule(config={"num_key_value_heads": 4}),
    # Muse Glimmer/Spark project pixel-shuffled vision features (vision width * merge_size**2 = 64 * 4) and,
    # for Spark, audio features of the text model's width.
    "muse_glimmer": Rule(config={"out_hidden_size": 256}),
    "muse_spark": Rule(config={"out_hidden_size": 256, "audio_config": {"out_hidden_size": 64}}),
    # MusicGen decoders take one row of audio codes per codebook, not one row of text tokens per sample.
    "musicgen": Rule(inputs=_codebook_rows),
    "musicgen_melody": Rule(inputs=_codebook_rows),
    # Perceiver cross-attends from latents to preprocessed inputs whose width (e.g. 261 = 3 + Fourier
    # features) no head count but 1 divides.
    # Its num_frames describes the multimodal autoencoder's video, not the image classifiers' input.
    "perceiver": Rule(config={"num_cross_attention_heads": 1}, inputs=lambda model, config, inputs, seed: _still_images(inputs)),
    # The flow head is conditioned on the backbone's hidden states (condition_dim must equal hidden_size).
    "pocket_tts": Rule(config={"flow_head_config": {"condition_dim": 64}}),
    # The decoder half of the codec decodes (batch, hidden_size, frames) latents.
    "pocket_tts_audio_tokenizer_decoder": Rule(inputs=_conv_hidden_states("hidden_size", 8, "latents")),
    # Pop2Piano's encoder reads audio features as its input embeddings, instead of text ids.
    "pop2piano": Rule(inputs=_pop2piano_features),
    # PP-DocLayout-V2's detection post-processing keeps boxes above a per-class threshold, given only by checkpoints.
    "pp_doclayout_v2": Rule(config={"class_thresholds": [0.5, 0.5], "class_order": [0, 1]}),
    # PP-DocLayout-V3's mask branch reads the HGNetV2 backbone's first stage, whose width (128 -> 8) x4_feat_dim repeats.
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
    # Like the Qwen2.5-Omni thinker, its M-RoPE index reads vision_start_token_id (no default).
    "qwen3_omni_moe_thinker": Rule(config={"vision_start_token_id": 1000}),
    # Qwen4-Exp's "indexed_attention" layers select tokens with a QSA indexer whose sizes default to None
    # (only real checkpoints set them): a small one, budget a multiple of the block size.
    "qwen4_exp": Rule(config={"text_config": _QSA}),
    "qwen4_exp_text": Rule(config=_QSA),
    # Griffin repeats block_types (recurrent, recurrent, attention): 3 layers keep one attention layer.
    "recurrent_gemma": Rule(config={"num_hidden_layers": 3}),
    # Reformer's axial position embeddings factor the sequence (4 x 4 = 16 tokens) and split hidden (16 + 48).
    "reformer": Rule(config={"axial_pos_embds_dim": [16, 48], "axial_pos_shape": [4, 4], "max_position_embeddings": 16,
                             "lsh_attn_chunk_length": 4, "local_attn_chunk_length": 4, "num_buckets": 2}),
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
    # ShieldGemma2 is Gemma 3 (4 image tokens) and also scores its Yes/No vocabulary entries, 10784 and
    # 3771 unless set: inside the shrunk vocab.
    "shieldgemma2": Rule(config={"mm_tokens_per_image": 4}, after={"yes_token_index": 10, "no_token_index": 11}),
    # SigLIP2 (NaFlex) takes pre-cut patches with their mask and grid shapes.
    "siglip2": Rule(inputs=_siglip2_patches),
    "siglip2_vision_model": Rule(inputs=_siglip2_patches),
    # Speech-encoder-decoder's default encoder (wav2vec2-style) reads the waveform; the filterbank features are the alternative.
    "speech-encoder-decoder": Rule(inputs=_drop("input_features", unless_missing="input_values")),
    # Splinter's pre-training head needs a question token in every row.
    "splinter": Rule(inputs=_question_fix),
    # Step3p7's sliding-attention heads need a window, which the config leaves None.
    "step3p7": Rule(config={"text_config": {"sliding_window": 8}}),
    # T5Gemma 2's encoder pools images like Gemma 3: 4 tokens.
    "t5gemma2": Rule(config={"encoder": {"mm_tokens_per_image": 4}}),
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
    # X-MOD routes every batch through a language adapter and refuses input without a language.
    "xmod": Rule(config={"default_language": "en_XX"}),
    # Zamba ties its shared transformer block across hybrid layers: two hybrid layers leave something to tie.
    "zamba": Rule(config={"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]}),
}


def rule_for(model_type: str) -> Rule:
    return RULES.get(model_type, NO_RULE)
