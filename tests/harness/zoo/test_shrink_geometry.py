"""Shrinking keeps sizes that are derived from other sizes (stage layout, feature maps, patch grids) consistent."""

from harness.zoo.shrink import Size, shrink_dict
from harness.zoo.transformers_zoo import tiny_config


def test_global_attention_blocks_keep_their_place_in_a_stage():
    # Hiera: blocks 5, 7, 9 are inside stage 2 (blocks 3..9), never the (query-pooling) first block of a stage
    d = {"blocks_per_stage": [1, 2, 7, 2], "global_attention_blocks": [5, 7, 9]}
    out = shrink_dict(d, Size())
    depths, blocks = out["blocks_per_stage"], out["global_attention_blocks"]
    starts = [sum(depths[:i]) for i in range(len(depths))]
    assert blocks and all(b not in starts for b in blocks)
    assert all(starts[2] <= b < starts[2] + depths[2] for b in blocks)


def test_backbone_feature_maps_follow_the_shrunk_backbone():
    c = tiny_config("sam2_vision_model")
    assert c.backbone_channel_list == c.backbone_config.embed_dim_per_stage[::-1]
    side = c.backbone_config.image_size[0] // c.backbone_config.patch_stride[0]
    assert c.backbone_feature_sizes[0] == [side, side]


def test_patch_grid_side_follows_image_and_patch():
    c = tiny_config("sam")
    assert c.prompt_encoder_config.image_embedding_size == c.vision_config.image_size // c.vision_config.patch_size


def test_image_size_repeating_a_vision_tower_follows_its_patch_rounding():
    d = {"image_size": 1008, "vision_config": {"model_type": "x", "image_size": 1008, "patch_size": 14}}
    out = shrink_dict(d, Size())
    assert out["image_size"] == out["vision_config"]["image_size"] and out["image_size"] % 14 == 0


def test_codec_base_width_leaves_the_deepest_stage_narrow():
    d = {"num_filters": 32, "downsampling_ratios": [2, 2, 4, 5, 5, 8]}
    out = shrink_dict(d, Size())
    assert out["num_filters"] * 2 ** len(out["downsampling_ratios"]) <= 128
    assert out["downsampling_ratios"] == d["downsampling_ratios"]  # the hop length is the architecture's


def test_hgnet_stage_channels_stay_chained_and_detr_heads_read_them():
    c = tiny_config("pp_doclayout_v3")
    b = c.backbone_config
    assert b.stage_in_channels[1:] == b.stage_out_channels[:-1] and b.stage_in_channels[0] == b.stem_channels[-1]
    assert b.hidden_sizes[-1] == b.stage_out_channels[-1] <= 256
    assert c.encoder_in_channels == b.hidden_sizes[-len(c.encoder_in_channels):]
    assert c.decoder_in_channels == [c.encoder_hidden_dim] * len(c.decoder_in_channels)


def test_zamba2_mamba_heads_tile_and_shared_attention_reads_twice_hidden():
    c = tiny_config("zamba2")
    assert c.n_mamba_heads * c.mamba_headdim == c.mamba_expand * c.hidden_size
    assert c.attention_hidden_size == 2 * c.hidden_size
    assert c.attention_head_dim * c.num_attention_heads == c.attention_hidden_size
    hybrid = [i for i, t in enumerate(c.layers_block_type) if t == "hybrid"]
    assert c.hybrid_layer_ids == hybrid


def test_ssm_groups_divide_the_shrunk_mamba_heads():
    c = tiny_config("nemotron_h")
    assert c.n_groups <= c.mamba_num_heads and c.mamba_num_heads % c.n_groups == 0


def test_depthwise_upsampling_groups_follow_the_hidden_size():
    c = tiny_config("pocket_tts_audio_tokenizer")
    assert c.upsample_groups == c.hidden_size


def test_vit_pooler_keeps_the_hidden_width():
    c = tiny_config("vit")
    assert c.pooler_output_size == c.hidden_size
