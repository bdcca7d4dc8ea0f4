"""The key-name rules of config shrinking (shrink.py): which setting is a depth, a width, a head count, a
vocabulary..., and the value it is lowered to; per-stage lists keep their length (the stage count is part of
the architecture)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


# Keys that never describe an architecture and must not be passed back to a config constructor.
DROP = {"transformers_version", "architectures", "_name_or_path", "_commit_hash", "auto_map", "dtype", "torch_dtype",
        "_attn_implementation_autoset", "output_attentions", "output_hidden_states", "return_dict"}


@dataclass(frozen=True)
class Size:
    """Target sizes: values above these are lowered to them (values already smaller are kept)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    vocab: int = 1024
    experts: int = 4
    top_k: int = 2
    image: int = 64
    positions: int = 512
    stage_width: int = 16  # first stage width of CNN / hierarchical backbones


def _rx(*alts: str) -> re.Pattern[str]:
    return re.compile("^(" + "|".join(alts) + ")$")


R_LAYERS = _rx(r"num_hidden_layers", r"num_layers", r"n_layers?", r"encoder_layers", r"decoder_layers",
               r"num_encoder_layers", r"num_decoder_layers", r"num_.*_layers", r".*_num_layers",
               r".*_num_hidden_layers", r"depth", r"num_blocks", r"n_blocks", r"text_layers", r"vision_layers", r"num_hidden_layers_.*",
               r"num_hidden_blocks", r".*_layers_count", r"num_layers_.*")
R_KV_HEADS = _rx(r"num_key_value_heads", r"n_kv_heads?", r"num_kv_heads", r".*_key_value_heads", r"multi_query_group_num")
R_HEADS = _rx(r"num_attention_heads", r"n_heads?", r"num_heads", r"encoder_attention_heads", r"decoder_attention_heads",
              r"attention_heads", r".*_attention_heads", r".*_num_heads", r"num_heads_.*", r"num_attention_heads_.*")
R_HEAD_DIM = _rx(r"head_dim", r"attention_head_dim", r"kv_channels", r"d_kv", r"qk_head_dim", r"v_head_dim",
                 r"qk_nope_head_dim", r"qk_rope_head_dim", r"attention_head_size", r".*_head_dim", r"rotary_dim")
R_HIDDEN = _rx(r"hidden_size", r"d_model", r"n_embd", r"embed_dim", r"dim", r"hidden_dim", r"model_dim", r"d_embed",
               r"embedding_size", r"emb_dim", r"word_embed_proj_dim", r"projection_dim", r"text_embed_dim",
               r"vision_embed_dim", r"encoder_hidden_size", r"decoder_hidden_size", r"output_hidden_size",
               r".*_hidden_size", r".*_embed_dim", r".*_d_model", r"embedding_dim", r"n_embed",
               r"projection_hidden_size", r"q_lora_rank", r"kv_lora_rank", r"hidden_channels",
               r"mm_hidden_size", r"adapter_hidden_size", r"d_latents", r".*_hidden_dim", r".*_embedding_dim",
               r"codebook_dim", r".*_projection_dim", r"hidden_size_.*", r"projection_size", r"lru_width",
               r"upsample_initial_channel", r"xvector_output_dim", r"speech_decoder_postnet_units", r"proj_dim", r"d_state_hidden", r"latent_dim",
               r"condition_dim", r".*_hidden_dimension", r"adapter_(in|out)_dim", r"projector_(input|output)_dim", r"vision_output_dim",
               r".*_predictor_channels", r"latent_channels",
               r"adapter_input_size")
R_INTERMEDIATE = _rx(r"intermediate_size", r"ffn_dim", r".*_ffn_dim", r"n_inner", r"d_ff", r"ffn_hidden_size",
                     r"mlp_dim", r"moe_intermediate_size", r"shared_expert_intermediate_size", r"d_inner",
                     r"feed_forward_size", r".*_intermediate_size", r"intermediate_dim", r"mlp_hidden_size",
                     r".*_ffn_hidden_size", r"encoder_ffn_dim", r"decoder_ffn_dim", r"dim_feedforward",
                     r".*_feedforward_dim", r"intermediate_size_.*", r"mlp_ratio_dim", r"(.*_)?linear_units")
R_EXPERTS = _rx(r"num_experts", r"num_local_experts", r"n_routed_experts", r"moe_num_experts", r"num_experts_per_layer",
                r"n_experts", r"num_routed_experts", r"zero_expert_num")
R_TOP_K = _rx(r"num_experts_per_tok", r"moe_topk", r"top_k", r"num_selected_experts", r"moe_k", r"n_group", r"num_expert_group",
              r"topk_group", r"num_experts_per_token")
R_VOCAB = _rx(r"vocab_size", r".*_vocab_size", r"vocab_size_.*", r".*_vocab", r"num_(bpe|wordpiece|character)_labels", r"codebook_size", r"num_codes", r"n_codes", r"num_embeddings")
R_TOKEN_ID = re.compile(r".*(_token_id|_token_index|_token_ids|_token)$")
R_POSITIONS = _rx(r"max_position_embeddings", r"max_target_positions", r"n_positions", r"n_ctx", r"max_seq_len",
                  r"max_sequence_length", r"seq_length", r"max_length", r"original_max_position_embeddings")
R_IMAGE = _rx(r"image_size", r"img_size", r"input_size", r"image_resolution")
R_STAGE_WIDTHS = _rx(r"hidden_sizes", r"embed_dims", r"dims", r"embedding_sizes", r"channels", r"hidden_dims",
                     r"neck_hidden_sizes", r"encoder_hidden_sizes", r"conv_dim", r"block_out_channels",
                     r"stage_channels", r"widths", r"out_channels_list", r"decoder_hidden_sizes",
                     r"encoder_hidden_dims", r"tdnn_dim", r"embed_dim", r"embed_dim_per_stage",
                     r"post_process_channels")
R_STAGE_DEPTHS = _rx(r"depths", r"num_layers_per_stage", r"layers", r"block_layers", r"stage_depths",
                     r"num_blocks_per_stage", r"block_repeats", r"encoder_layers_per_stage", r"stage_num_blocks",
                     r"depth", r"blocks_per_stage")
R_STAGE_HEADS = _rx(r"num_heads", r"num_attention_heads", r"heads", r"attention_heads", r"encoder_attention_heads",
                    r"num_heads_per_stage", r"num_attention_heads_per_stage")


# Scaling factors of EfficientNet/MobileNet-style families (channel and repeat multipliers).
MULTIPLIERS = {"width_coefficient": 0.25, "depth_coefficient": 0.5, "width_multiplier": 0.25}


# Lists whose length is a stage/feature count that must not be cut even if it equals the layer count.
KEEP_LENGTH = {"conv_kernel", "conv_stride", "out_features", "out_indices", "stage_names", "strides", "patch_sizes",
               "kernel_sizes", "sr_ratios", "mlp_ratios", "depths", "lags_sequence", "aux_loss_indices"}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shrink_int(key: str, v: int, d: dict[str, Any], size: Size) -> int:
    """The new value of one integer setting (never larger than the old one)."""
    if v <= 0:
        return v
    if R_LAYERS.match(key):
        return min(v, size.layers)
    if R_KV_HEADS.match(key):
        return min(v, size.kv_heads)
    if R_HEADS.match(key):
        return min(v, size.heads)
    if R_HEAD_DIM.match(key):
        return min(v, size.head_dim)
    if R_INTERMEDIATE.match(key):
        return min(v, size.intermediate)
    if R_HIDDEN.match(key):
        return min(v, size.hidden)
    if R_EXPERTS.match(key):
        return min(v, size.experts)
    if R_TOP_K.match(key):
        return min(v, size.top_k)
    if R_VOCAB.match(key):
        return min(v, size.vocab)
    if R_POSITIONS.match(key):
        return min(v, size.positions)
    if R_IMAGE.match(key):
        patch = d.get("patch_size") if is_int(d.get("patch_size")) and d["patch_size"] > 0 else 16
        # a whole number of patches (at least 2 per side), close to size.image
        return min(v, patch * max(2, size.image // patch))
    if key == "base_channels":
        return min(v, 32)  # VQ-GAN encoders multiply it per resolution level (up to x4 or x8)
    if key in ("num_filters", "codebook_dim_base"):
        return min(v, 8)  # audio codecs double this base width at every downsampling stage
    if key in ("max_img_size",):
        return min(v, size.image)
    if key in ("num_frames", "visual_prompt_size") and v > 8:
        return 8
    if key in ("num_queries", "num_query_tokens", "num_latents", "num_register_tokens") and v > 16:
        return 16
    if key == "max_source_positions":
        return min(v, 64)
    return v


def shrink_int_list(key: str, v: list[int], size: Size) -> list[int] | None:
    """Shrink a per-stage list, keeping its length (the number of stages is part of the architecture)."""
    if R_IMAGE.match(key) and len(v) in (2, 3):
        return [min(x, size.image) for x in v]
    if R_STAGE_DEPTHS.match(key):
        return [min(x, 1) for x in v]
    if R_STAGE_HEADS.match(key):
        return [min(x, 2) for x in v]
    if R_STAGE_WIDTHS.match(key):
        scale = size.stage_width / max(v[0], 1)
        if scale >= 1:
            return None
        # Keep the stage ratios and a multiple of 8 so group norms and head splits still divide.
        return [max(8, int(round(x * scale / 8)) * 8) if x > 8 else x for x in v]
    return None


def cut_layer_list(v: list[Any], n: int) -> list[Any]:
    """Cut a per-layer list to `n` entries keeping one layer of each kind (hybrid models need all kinds)."""
    if all(isinstance(x, str) for x in v):
        kinds = list(dict.fromkeys(v))
        if len(kinds) >= n:
            return kinds
        return kinds + [v[i] for i in range(len(v)) if i >= len(kinds)][: n - len(kinds)]
    return list(v[:n])


def is_subconfig(key: str, v: Any) -> bool:
    return isinstance(v, dict) and ("model_type" in v or key.endswith("_config") or key in ("encoder", "decoder"))


def subconfigs(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for k, v in d.items():
        if is_subconfig(k, v):
            out += [v] + subconfigs(v)
    return out
