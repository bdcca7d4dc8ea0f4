"""Per-family fixes where generic shrinking is not enough, one row per model_type.

A rule can give constructor arguments for the unshrunk base config (`base`, when the class's own defaults
do not validate), values merged over the shrunk config dict (`config`), attributes set after construction
(`after`), and an input fixer (`inputs`) for models whose forward needs something the generic builders
cannot derive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.zoo.override_inputs import (  # noqa: F401 - the rules below name them
    _apertus_inputs, _audio_features, _audio_padding_mask, _blip_question_answers, _chameleon_vocab,
    _codebook_rows, _conv_hidden_states, _csm_audio, _drop, _emu3_vocab, _extra_inputs, _gemma3n_mel,
    _gemma4_patches, _high_res_images, _idefics_images, _image_pairs, _image_sizes,
    _kosmos2_image_positions, _longformer_separators, _mel_first, _merged_patch_images, _mllama_tiles,
    _one_audio_token, _packed_patches, _patch_images, _pop2piano_features, _qformer_queries, _question_fix,
    _seggpt_prompt, _siglip2_patches, _still_images, _text_and_codes, _text_line_images, _tiles,
    _timesfm_context, _trajectories, _tube_mask, _udop_boxes, _without,
)

DELETE = object()  # in `config`: drop the key so the constructor derives it


@dataclass(frozen=True)
class Rule:
    base: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    inputs: Callable[[Any, Any, dict[str, Any], int], dict[str, Any]] | None = None


NO_RULE = Rule()


_FOUR_STAGES = ["stage1", "stage2", "stage3", "stage4"]
_COMPASS_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}


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
                                   "num_key_value_heads": 8,
                                   # at random init no coarse match clears the default 0.2 confidence (the
                                   # dual-softmax scores are ~1/4096 each) and the 2-cell border removal leaves
                                   # 4 of the 8 x 8 cells: matching_scores were all zeros (uninformative)
                                   "coarse_matching_threshold": 0.0, "coarse_matching_border_removal": 0},
                           inputs=_image_pairs),
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
    # Their vision configs initialise weights with std 1e-10 (initializer_range): the image reached the neck at
    # ~1e-13 beside the position embedding's 0.02, and the masks were bit-identical for any image (issue 32's
    # uninformative rows); transformers' usual 0.02 lets the image through.
    "sam": Rule(config={"vision_config": {"output_channels": 64, "num_pos_feats": 32, "initializer_range": 0.02}}),
    "sam_hq": Rule(config={"vision_config": {"output_channels": 64, "num_pos_feats": 32, "initializer_range": 0.02},
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
