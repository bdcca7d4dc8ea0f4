"""Generic shrinking keeps each architecture's invariants."""

import pytest

from harness.zoo import ZooBuildError
from harness.zoo.budget import check_budget
from harness.zoo.shrink import Size, cap_layers, shrink_dict
from harness.zoo.transformers_zoo import tiny_config


def test_llama_is_tiny_and_consistent():
    c = tiny_config("llama")
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (64, 2, 1024)
    assert c.hidden_size % c.num_attention_heads == 0
    assert c.num_attention_heads % c.num_key_value_heads == 0
    assert c.head_dim * c.num_attention_heads == c.hidden_size
    assert c.bos_token_id < c.vocab_size and c.eos_token_id < c.vocab_size


def test_hybrid_layer_types_keep_one_layer_of_each_kind():
    d = {"num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "hidden_size": 64}
    out = shrink_dict(d, Size())
    assert out["num_hidden_layers"] == 2
    assert sorted(out["layer_types"]) == ["full_attention", "sliding_attention"]
    d = {"num_hidden_layers": 8, "layer_types": ["a", "b", "c"] + ["a"] * 5}
    out = shrink_dict(d, Size())
    assert out["num_hidden_layers"] == 3 and set(out["layer_types"]) == {"a", "b", "c"}


def test_token_ids_move_inside_the_vocabulary():
    d = {"vocab_size": 150000, "bos_token_id": 1, "eos_token_id": 149999, "image_token_id": 151655,
         "text_config": {"model_type": "llama", "vocab_size": 150000}}
    out = shrink_dict(d, Size())
    assert out["vocab_size"] == 1024
    assert out["bos_token_id"] == 1
    assert 1 < out["eos_token_id"] < 1024 and 1 < out["image_token_id"] < 1024
    assert out["eos_token_id"] != out["image_token_id"]
    assert out["text_config"]["vocab_size"] == 1024


def test_mla_keeps_multi_head_kv_and_qk_head_dim():
    c = tiny_config("deepseek_v3")
    assert c.num_key_value_heads == c.num_attention_heads
    assert c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim


def test_plain_backbone_keeps_its_number_of_outputs():
    c = tiny_config("dpt")
    assert len(c.backbone_out_indices) == len(c.neck_hidden_sizes)
    assert max(c.backbone_out_indices) < c.num_hidden_layers


def test_cap_layers_keeps_widths():
    d = {"hidden_size": 4096, "num_hidden_layers": 32, "vision_config": {"model_type": "siglip_vision_model",
                                                                          "num_hidden_layers": 27, "hidden_size": 1152}}
    out = cap_layers(d, 2)
    assert out["hidden_size"] == 4096 and out["num_hidden_layers"] == 2
    assert out["vision_config"]["num_hidden_layers"] == 2 and out["vision_config"]["hidden_size"] == 1152


def test_budget_is_checked_before_allocation():
    import torch

    with pytest.raises(ZooBuildError) as info:
        check_budget(lambda: torch.nn.Linear(4096, 4096), budget=1_000_000)
    assert info.value.category == "over_budget" and "weight (4096, 4096)" in str(info.value)
    assert check_budget(lambda: torch.nn.Linear(8, 8), budget=1_000_000) == 72


def test_any_resolution_grids_follow_the_shrunk_image_size():
    d = {"image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336]],
         "vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}}
    out = shrink_dict(d, Size())
    size = out["vision_config"]["image_size"]
    assert out["image_grid_pinpoints"] == [[size, 2 * size], [2 * size, size]]


def test_chained_channel_lists_share_one_scale():
    c = tiny_config("hgnet_v2")
    assert max(c.stage_out_channels) <= 256
    assert c.stage_in_channels[1:] == c.stage_out_channels[:-1]  # stage i feeds stage i + 1
    assert c.stem_channels[-1] == c.stage_in_channels[0] and c.hidden_sizes[-1] == c.stage_out_channels[-1]


def test_lists_repeating_a_width_follow_it():
    d = {"d_model": 256, "decoder_in_channels": [256, 256, 256], "feat_strides": [8, 16, 32]}
    out = shrink_dict(d, Size())
    assert out["decoder_in_channels"] == [out["d_model"]] * 3 and out["feat_strides"] == [8, 16, 32]


def test_mla_head_dim_that_was_qk_head_dim_stays_so():
    c = tiny_config("mistral4")  # its rotary part is head_dim * partial_rotary_factor = qk_rope_head_dim
    assert c.head_dim == c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim


def test_per_layer_overrides_keep_multi_head_kv():
    d = {"num_hidden_layers": 8, "per_layer_config": {"02": {"num_attention_heads": 64, "num_key_value_heads": 64}}}
    sub = shrink_dict(d, Size())["per_layer_config"]["01"]
    assert sub["num_key_value_heads"] == sub["num_attention_heads"]


def test_group_counts_and_quantizer_widths_follow_the_hidden_size():
    c = tiny_config("mimi")
    assert c.upsample_groups == c.hidden_size  # depthwise upsampling
    assert c.vector_quantization_hidden_dimension == c.codebook_dim


def test_layout_embeddings_still_fill_the_hidden_size():
    c = tiny_config("layoutlmv3")
    assert 4 * c.coordinate_size + 2 * c.shape_size == c.hidden_size


def test_encoder_decoder_multi_head_attention_stays_so():
    c = tiny_config("moonshine")  # its attention reshapes queries with the kv head count
    assert c.encoder_num_key_value_heads == c.encoder_num_attention_heads
    assert c.decoder_num_key_value_heads == c.decoder_num_attention_heads


def test_more_width_keys_shrink():
    d = {"base_channels": 128, "latent_channels": 256, "pitch_predictor_channels": 256, "encoder_linear_units": 1536,
         "zero_expert_num": 256, "projector_input_dim": 4096, "post_process_channels": [128, 256, 512, 1024]}
    out = shrink_dict(d, Size())
    assert out["base_channels"] <= 32 and out["latent_channels"] <= 64 and out["pitch_predictor_channels"] <= 64
    assert out["encoder_linear_units"] <= 128 and out["zero_expert_num"] <= 4 and out["projector_input_dim"] <= 64
    assert out["post_process_channels"] == [16, 32, 64, 128]
