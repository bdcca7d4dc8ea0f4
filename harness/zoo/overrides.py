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
    tiles = getattr(getattr(config, "vision_config", None) or config, "max_num_tiles")
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

RULES: dict[str, Rule] = {
    # X-MOD routes every batch through a language adapter and refuses input without a language.
    "xmod": Rule(config={"default_language": "en_XX"}),
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
    # BEiT-style segmentation reads exactly 4 encoder layers (out_indices, [3, 5, 7, 11] of 12): 4 layers, all read.
    "beit": Rule(config={"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4], "out_features": _FOUR_STAGES,
                         "stage_names": ["stem"] + _FOUR_STAGES}),
    # BiT normalises with GroupNorm(32) everywhere, down to the bottleneck's width / 4: keep stages >= 128 wide.
    "bit": Rule(config={"hidden_sizes": [128, 256, 512, 1024], "embedding_size": 64}),
    # BLIP's VQA head decodes an answer and needs its decoder input at inference.
    "blip": Rule(inputs=_blip_question_answers),
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
    # FLAVA pretraining computes its losses by default (return_loss), which needs the processor's codebook
    # pixels for masked-image labels: run it as inference.
    "flava": Rule(config={"return_loss": False}),
    # Florence-2 projects image features to the language model's width (1024 = d_model in both defaults).
    "florence2": Rule(config={"vision_config": {"projection_dim": 64}}),
    # Fun-ASR's adaptor bottleneck is a quarter of the LLM width.
    "fun_asr_nano": Rule(config={"adaptor_config": {"intermediate_size": 16}}),
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
    "granite_speech_plus": Rule(inputs=lambda model, config, inputs, seed: _without(inputs, "input_features_mask")),
    # Granite Speech 5 delta-expands (x2) and pair-stacks (x2) its mel frames: 4 x num_mel_bins features.
    "granite_speech5_ctc": Rule(inputs=_audio_features(320)),
    "granite_speech5_encoder": Rule(inputs=_audio_features(320)),
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
    # Molmo 2 concatenates features of two vision layers (24 and 18 of 27): the last two of the shrunk tower.
    "molmo2": Rule(config={"adapter_config": {"vision_feature_layer": [-1, -2]}}),
    # Gemma 3 pools the vision tower's patch grid down to mm_tokens_per_image (a square): 4 patches per side
    # at 64 px, so 4 tokens (2 x 2), not the default 256.
    "gemma3": Rule(config={"mm_tokens_per_image": 4}),
    "shieldgemma2": Rule(config={"mm_tokens_per_image": 4}),
    "t5gemma2": Rule(config={"encoder": {"mm_tokens_per_image": 4}}),
    # MobileBERT's bottleneck widths are separate keys that must follow the shrunk hidden size.
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
    "mobilebert": Rule(config={"embedding_size": 64, "intra_bottleneck_size": 64, "true_hidden_size": 64}),
}


def rule_for(model_type: str) -> Rule:
    return RULES.get(model_type, NO_RULE)
