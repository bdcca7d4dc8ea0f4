"""The input fixers of the per-family rules (overrides.py): for models whose forward needs something the generic
builders cannot derive, each takes (model, config, inputs, seed) and returns the inputs to use."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


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
