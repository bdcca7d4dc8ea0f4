"""Built-in diffusers entries: tiny model classes (one row per family: constructor arguments plus an input
recipe) and tiny pipelines assembled from those models, with tokenizers built in code.

Diffusers has no config-class registry to shrink generically (forward inputs differ per family), so each
row here is hand-sized: channel widths 16-64, one or two blocks, 1-2 layers, 8-32 px latents."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.zoo import budget
from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry

B = 2  # batch


@dataclass(frozen=True)
class ModelSpec:
    name: str  # entry id suffix (usually the class name)
    cls: str
    task: str
    init: dict[str, Any]
    inputs: Callable[[torch.Generator], dict[str, Any]]


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _t(value: float = 10.0) -> torch.Tensor:
    return torch.full((B,), value)


UNET_COND = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=32,
                 attention_head_dim=8)
VAE_KL = dict(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=32,
              down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
              up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), sample_size=32)
UNET_3D = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
               down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"), up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
               cross_attention_dim=32, attention_head_dim=4, norm_num_groups=32)
CONTROLNET = dict(block_out_channels=(32, 64), layers_per_block=1, in_channels=4, cross_attention_dim=32,
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), conditioning_embedding_out_channels=(16, 32),
                  norm_num_groups=32, attention_head_dim=8)
FLUX = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
SD3 = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
           caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4, pos_embed_max_size=16)


def _unet2d(g):
    return {"sample": _randn(g, B, 3, 32, 32), "timestep": _t()}


def _unet_cond(g):
    return {"sample": _randn(g, B, 4, 16, 16), "timestep": _t(), "encoder_hidden_states": _randn(g, B, 8, 32)}


def _vae(g):
    return {"sample": _randn(g, B, 3, 32, 32)}


def _flux(g):
    return {"hidden_states": _randn(g, B, 64, 16), "encoder_hidden_states": _randn(g, B, 8, 32),
            "pooled_projections": _randn(g, B, 32), "timestep": torch.full((B,), 0.5),
            "img_ids": _grid_ids(8, 8), "txt_ids": torch.zeros(8, 3)}


def _grid_ids(h: int, w: int) -> torch.Tensor:
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def _sd3(g):
    return {"hidden_states": _randn(g, B, 4, 16, 16), "encoder_hidden_states": _randn(g, B, 8, 32),
            "pooled_projections": _randn(g, B, 64), "timestep": _t()}


def _video_cond(g, c=4, f=2, hw=16, d=32):
    return {"sample": _randn(g, B, c, f, hw, hw), "timestep": _t(), "encoder_hidden_states": _randn(g, B, 8, d)}


MODEL_SPECS: list[ModelSpec] = [
    # ---- UNets
    ModelSpec("UNet1DModel", "UNet1DModel", "diffusion-unet",
              dict(sample_size=512, sample_rate=16000, in_channels=2, out_channels=2, block_out_channels=(32, 32, 64),
                   extra_in_channels=64, use_timestep_embedding=False),
              lambda g: {"sample": _randn(g, B, 2, 512), "timestep": _t()}),
    ModelSpec("UNet2DModel", "UNet2DModel", "diffusion-unet",
              dict(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                   norm_num_groups=32), _unet2d),
    ModelSpec("UNet2DModel-class-conditional", "UNet2DModel", "diffusion-unet",
              dict(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                   class_embed_type=None, num_class_embeds=10, time_embedding_type="fourier", norm_num_groups=32),
              lambda g: {**_unet2d(g), "class_labels": torch.tensor([1, 3])}),
    ModelSpec("UNet2DConditionModel", "UNet2DConditionModel", "diffusion-unet", UNET_COND, _unet_cond),
    ModelSpec("UNet2DConditionModel-sdxl", "UNet2DConditionModel", "diffusion-unet",
              {**UNET_COND, "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
               "projection_class_embeddings_input_dim": 80, "transformer_layers_per_block": (1, 2)},
              lambda g: {**_unet_cond(g), "added_cond_kwargs": {"text_embeds": _randn(g, B, 32),
                                                                "time_ids": _randn(g, B, 6)}}),
    ModelSpec("UNet3DConditionModel", "UNet3DConditionModel", "diffusion-unet", UNET_3D, _video_cond),
    ModelSpec("UNetSpatioTemporalConditionModel", "UNetSpatioTemporalConditionModel", "diffusion-unet",
              dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=8, out_channels=4,
                   down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
                   up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"), cross_attention_dim=32,
                   num_attention_heads=(2, 4), addition_time_embed_dim=8, projection_class_embeddings_input_dim=24),
              lambda g: {"sample": _randn(g, B, 2, 8, 16, 16), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 1, 32), "added_time_ids": _randn(g, B, 3)}),
    ModelSpec("I2VGenXLUNet", "I2VGenXLUNet", "diffusion-unet",
              dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
                   down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"), up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
                   cross_attention_dim=32, attention_head_dim=4, num_attention_heads=None, norm_num_groups=32),
              lambda g: {"sample": _randn(g, B, 4, 2, 16, 16), "timestep": _t(), "fps": torch.tensor([8, 8]),
                         "image_latents": _randn(g, B, 4, 2, 16, 16), "image_embeddings": _randn(g, B, 32),
                         "encoder_hidden_states": _randn(g, B, 8, 32)}),
    ModelSpec("UVit2DModel", "UVit2DModel", "diffusion-unet",
              dict(hidden_size=32, cond_embed_dim=32, micro_cond_encode_dim=2, micro_cond_embed_dim=10,
                   encoder_hidden_size=32, vocab_size=33, codebook_size=32, in_channels=32, block_out_channels=32,
                   num_res_blocks=1, block_num_heads=2, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=64, sample_size=8),
              lambda g: {"input_ids": torch.randint(0, 32, (B, 8, 8), generator=g),
                         "encoder_hidden_states": _randn(g, B, 8, 32), "pooled_text_emb": _randn(g, B, 32),
                         "micro_conds": _randn(g, B, 5)}),
    ModelSpec("AudioLDM2UNet2DConditionModel", "AudioLDM2UNet2DConditionModel", "diffusion-unet",
              dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
                   down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                   cross_attention_dim=([None, 16, 32], [None, 16, 32]), norm_num_groups=32, attention_head_dim=8),
              lambda g: {"sample": _randn(g, B, 4, 16, 16), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 8, 16), "encoder_hidden_states_1": _randn(g, B, 8, 32)}),
    # ---- autoencoders
    ModelSpec("AutoencoderKL", "AutoencoderKL", "vae", VAE_KL, _vae),
    ModelSpec("AsymmetricAutoencoderKL", "AsymmetricAutoencoderKL", "vae",
              dict(down_block_out_channels=(32, 64), up_block_out_channels=(32, 64), latent_channels=4,
                   down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                   norm_num_groups=32, sample_size=32), _vae),
    ModelSpec("AutoencoderTiny", "AutoencoderTiny", "vae",
              dict(encoder_block_out_channels=(16, 16), decoder_block_out_channels=(16, 16), num_encoder_blocks=(1, 1),
                   num_decoder_blocks=(1, 1), latent_channels=4), _vae),
    ModelSpec("VQModel", "VQModel", "vae",
              dict(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=3, num_vq_embeddings=32,
                   down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                   norm_num_groups=32), _vae),
    ModelSpec("AutoencoderKLTemporalDecoder", "AutoencoderKLTemporalDecoder", "vae",
              dict(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2, latent_channels=4,
                   layers_per_block=1), lambda g: {"sample": _randn(g, B, 3, 32, 32), "num_frames": B}),
    ModelSpec("AutoencoderOobleck", "AutoencoderOobleck", "vae",
              dict(encoder_hidden_size=8, downsampling_ratios=[2, 4], channel_multiples=[1, 2], decoder_channels=8,
                   decoder_input_channels=4, audio_channels=2), lambda g: {"sample": _randn(g, B, 2, 256)}),
    ModelSpec("AutoencoderDC", "AutoencoderDC", "vae",
              dict(latent_channels=4, attention_head_dim=8, encoder_block_types=("ResBlock", "EfficientViTBlock"),
                   decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(16, 32),
                   decoder_block_out_channels=(16, 32), encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                   encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                   decoder_norm_types="rms_norm", decoder_act_fns="silu"), _vae),
    ModelSpec("AutoencoderKLCogVideoX", "AutoencoderKLCogVideoX", "vae",
              dict(block_out_channels=(16, 32), down_block_types=("CogVideoXDownBlock3D",) * 2,
                   up_block_types=("CogVideoXUpBlock3D",) * 2, latent_channels=4, layers_per_block=1, norm_num_groups=8,
                   temporal_compression_ratio=2), lambda g: {"sample": _randn(g, 1, 3, 3, 16, 16)}),
    ModelSpec("AutoencoderKLLTXVideo", "AutoencoderKLLTXVideo", "vae",
              dict(latent_channels=8, block_out_channels=(16, 32), decoder_block_out_channels=(16, 32),
                   down_block_types=("LTXVideoDownBlock3D",) * 2, layers_per_block=(1, 1, 1),
                   decoder_layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, True),
                   decoder_spatio_temporal_scaling=(True, True), decoder_inject_noise=(False, False, False),
                   upsample_residual=(False, False), upsample_factor=(1, 1), patch_size=1, patch_size_t=1),
              lambda g: {"sample": _randn(g, 1, 3, 5, 16, 16)}),
    ModelSpec("AutoencoderKLWan", "AutoencoderKLWan", "vae",
              dict(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
                   latents_mean=[0.0] * 4, latents_std=[1.0] * 4), lambda g: {"sample": _randn(g, 1, 3, 5, 16, 16)}),
    ModelSpec("AutoencoderKLQwenImage", "AutoencoderKLQwenImage", "vae",
              dict(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
                   latents_mean=[0.0] * 4, latents_std=[1.0] * 4), lambda g: {"sample": _randn(g, 1, 3, 1, 16, 16)}),
    ModelSpec("AutoencoderKLMochi", "AutoencoderKLMochi", "vae",
              dict(in_channels=15, encoder_block_out_channels=(32, 64), decoder_block_out_channels=(32, 64),
                   latent_channels=4, layers_per_block=(1, 1, 1), temporal_expansions=(1,), spatial_expansions=(2,),
                   add_attention_block=(False, False, False), latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
              lambda g: {"sample": _randn(g, 1, 3, 1, 16, 16)}),
    ModelSpec("DiTTransformer2DModel", "DiTTransformer2DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, sample_size=8,
                   patch_size=2, num_layers=2, num_embeds_ada_norm=1000),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "timestep": _t(), "class_labels": torch.tensor([1, 7])}),
    ModelSpec("PixArtTransformer2DModel", "PixArtTransformer2DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, sample_size=8,
                   patch_size=2, num_layers=2, cross_attention_dim=16, caption_channels=32),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 8, 32),
                         "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}),
    ModelSpec("Transformer2DModel-continuous", "Transformer2DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=32, num_layers=1, norm_num_groups=8,
                   cross_attention_dim=16),
              lambda g: {"hidden_states": _randn(g, B, 32, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 16)}),
    ModelSpec("FluxTransformer2DModel", "FluxTransformer2DModel", "diffusion-transformer", FLUX, _flux),
    ModelSpec("SD3Transformer2DModel", "SD3Transformer2DModel", "diffusion-transformer", SD3, _sd3),
    ModelSpec("HunyuanDiT2DModel", "HunyuanDiT2DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8,
                   hidden_size=16, num_layers=2, cross_attention_dim=32, cross_attention_dim_t5=32,
                   pooled_projection_dim=16, text_len=8, text_len_t5=8, use_style_cond_and_image_meta_size=True),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 8, 32), "text_embedding_mask": torch.ones(B, 8),
                         "encoder_hidden_states_t5": _randn(g, B, 8, 32), "text_embedding_mask_t5": torch.ones(B, 8),
                         "image_meta_size": torch.tensor([[32, 32, 32, 32, 0, 0]] * B, dtype=torch.float32),
                         "style": torch.zeros(B, dtype=torch.long),
                         "image_rotary_emb": _hunyuan_rope(8, 8, 2, 8)}),
    ModelSpec("SanaTransformer2DModel", "SanaTransformer2DModel", "diffusion-transformer",
              dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                   num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=32,
                   sample_size=8, patch_size=1),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 32),
                         "timestep": _t()}),
    ModelSpec("AuraFlowTransformer2DModel", "AuraFlowTransformer2DModel", "diffusion-transformer",
              dict(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                   attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
                   out_channels=4, pos_embed_max_size=16),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 32),
                         "timestep": _t()}),
    ModelSpec("Lumina2Transformer2DModel", "Lumina2Transformer2DModel", "diffusion-transformer",
              dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=2, num_refiner_layers=1,
                   num_attention_heads=2, num_kv_heads=1, multiple_of=16, cap_feat_dim=16, axes_dim_rope=(4, 6, 6),
                   axes_lens=(32, 32, 32)),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "timestep": _t(0.5),
                         "encoder_hidden_states": _randn(g, B, 8, 16),
                         "encoder_attention_mask": torch.ones(B, 8, dtype=torch.bool)}),
    ModelSpec("CogVideoXTransformer3DModel", "CogVideoXTransformer3DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
                   text_embed_dim=16, num_layers=1, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
                   temporal_compression_ratio=4, max_text_seq_length=8),
              lambda g: {"hidden_states": _randn(g, B, 2, 4, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 16),
                         "timestep": _t()}),
    ModelSpec("LatteTransformer3DModel", "LatteTransformer3DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=1,
                   sample_size=8, patch_size=2, cross_attention_dim=16, caption_channels=32, video_length=2,
                   norm_type="ada_norm_single", num_embeds_ada_norm=1000),
              lambda g: {"hidden_states": _randn(g, B, 4, 2, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 32),
                         "timestep": _t(), "enable_temporal_attentions": True}),
    ModelSpec("AllegroTransformer3DModel", "AllegroTransformer3DModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=1,
                   cross_attention_dim=16, sample_height=8, sample_width=8, sample_frames=8, caption_channels=32),
              lambda g: {"hidden_states": _randn(g, B, 4, 2, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 32),
                         "timestep": _t()}),
    ModelSpec("LTXVideoTransformer3DModel", "LTXVideoTransformer3DModel", "diffusion-transformer",
              dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
                   attention_head_dim=8, cross_attention_dim=16, num_layers=1, caption_channels=32),
              lambda g: {"hidden_states": _randn(g, B, 2 * 4 * 4, 8), "encoder_hidden_states": _randn(g, B, 8, 32),
                         "timestep": _t(), "encoder_attention_mask": torch.ones(B, 8), "num_frames": 2, "height": 4,
                         "width": 4}),
    ModelSpec("MochiTransformer3DModel", "MochiTransformer3DModel", "diffusion-transformer",
              dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1, pooled_projection_dim=16,
                   in_channels=4, text_embed_dim=16, time_embed_dim=4, max_sequence_length=8),
              lambda g: {"hidden_states": _randn(g, B, 4, 2, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 16),
                         "timestep": _t(), "encoder_attention_mask": torch.ones(B, 8, dtype=torch.bool)}),
    ModelSpec("WanTransformer3DModel", "WanTransformer3DModel", "diffusion-transformer",
              dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                   text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32),
              lambda g: {"hidden_states": _randn(g, B, 4, 2, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 16),
                         "timestep": _t()}),
    ModelSpec("HunyuanVideoTransformer3DModel", "HunyuanVideoTransformer3DModel", "diffusion-transformer",
              dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                   num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16,
                   pooled_projection_dim=8, rope_axes_dim=(2, 2, 4)),
              lambda g: {"hidden_states": _randn(g, B, 4, 1, 8, 8), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 8, 16), "encoder_attention_mask": torch.ones(B, 8),
                         "pooled_projections": _randn(g, B, 8), "guidance": torch.full((B,), 3.5)}),
    ModelSpec("CogView3PlusTransformer2DModel", "CogView3PlusTransformer2DModel", "diffusion-transformer",
              dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=4,
                   out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8,
                   sample_size=8),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 8),
                         "timestep": _t(), "original_size": torch.tensor([[8, 8]] * B),
                         "target_size": torch.tensor([[8, 8]] * B), "crop_coords": torch.tensor([[0, 0]] * B)}),
    ModelSpec("CogView4Transformer2DModel", "CogView4Transformer2DModel", "diffusion-transformer",
              dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=4,
                   out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4, pos_embed_max_size=8,
                   sample_size=8, rope_axes_dim=(2, 2)),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "encoder_hidden_states": _randn(g, B, 8, 8),
                         "timestep": _t(), "original_size": torch.tensor([[8, 8]] * B),
                         "target_size": torch.tensor([[8, 8]] * B), "crop_coords": torch.tensor([[0, 0]] * B)}),
    ModelSpec("QwenImageTransformer2DModel", "QwenImageTransformer2DModel", "diffusion-transformer",
              dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)),
              lambda g: {"hidden_states": _randn(g, B, 16, 16), "encoder_hidden_states": _randn(g, B, 8, 16),
                         "encoder_hidden_states_mask": torch.ones(B, 8, dtype=torch.long), "timestep": _t(0.5),
                         "img_shapes": [(1, 4, 4)] * B}),
    ModelSpec("ChromaTransformer2DModel", "ChromaTransformer2DModel", "diffusion-transformer",
              dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8),
                   approximator_num_channels=8, approximator_hidden_dim=16, approximator_layers=1),
              lambda g: {k: v for k, v in _flux(g).items() if k != "pooled_projections"}),
    ModelSpec("StableAudioDiTModel", "StableAudioDiTModel", "diffusion-transformer",
              dict(sample_size=16, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                   num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16, time_proj_dim=8,
                   global_states_input_dim=16, cross_attention_input_dim=16),
              lambda g: {"hidden_states": _randn(g, B, 4, 16), "timestep": _t(),
                         "encoder_hidden_states": _randn(g, B, 8, 16), "global_hidden_states": _randn(g, B, 1, 16),
                         "rotary_embedding": _stable_audio_rope(17, 4)}),
    ModelSpec("PriorTransformer", "PriorTransformer", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, num_layers=2, embedding_dim=16, num_embeddings=8,
                   additional_embeddings=4),
              lambda g: {"hidden_states": _randn(g, B, 16), "timestep": _t(), "proj_embedding": _randn(g, B, 16),
                         "encoder_hidden_states": _randn(g, B, 8, 16), "attention_mask": torch.ones(B, 8, dtype=torch.bool)}),
    ModelSpec("TransformerTemporalModel", "TransformerTemporalModel", "diffusion-transformer",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=16, num_layers=1, norm_num_groups=8),
              lambda g: {"hidden_states": _randn(g, 2 * B, 16, 8, 8), "num_frames": 2}),
    # ---- control / adapters
    ModelSpec("ControlNetModel", "ControlNetModel", "controlnet", CONTROLNET,
              lambda g: {**_unet_cond(g), "controlnet_cond": _randn(g, B, 3, 32, 32)}),
    ModelSpec("SD3ControlNetModel", "SD3ControlNetModel", "controlnet",
              {k: v for k, v in SD3.items() if k != "out_channels"},
              lambda g: {**_sd3(g), "controlnet_cond": _randn(g, B, 4, 16, 16)}),
    ModelSpec("FluxControlNetModel", "FluxControlNetModel", "controlnet", FLUX,
              lambda g: {**_flux(g), "controlnet_cond": _randn(g, B, 64, 16)}),
    ModelSpec("SparseControlNetModel", "SparseControlNetModel", "controlnet",
              dict(block_out_channels=(32, 64), layers_per_block=1, in_channels=4, conditioning_channels=3,
                   down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"), cross_attention_dim=32,
                   conditioning_embedding_out_channels=(16, 32), norm_num_groups=32, attention_head_dim=8,
                   motion_max_seq_length=8, motion_num_attention_heads=2, temporal_transformer_layers_per_block=1),
              lambda g: {"sample": _randn(g, 1, 4, 2, 16, 16), "timestep": torch.tensor([10.0]),
                         "encoder_hidden_states": _randn(g, 2, 8, 32), "controlnet_cond": _randn(g, 1, 3, 2, 16, 16),
                         "conditioning_mask": torch.ones(1, 1, 2, 16, 16)}),
    ModelSpec("HunyuanDiT2DControlNetModel", "HunyuanDiT2DControlNetModel", "controlnet",
              dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8,
                   hidden_size=16, cross_attention_dim=32, cross_attention_dim_t5=32,
                   pooled_projection_dim=16, text_len=8, text_len_t5=8, use_style_cond_and_image_meta_size=True,
                   transformer_num_layers=4),
              lambda g: {"hidden_states": _randn(g, B, 4, 8, 8), "timestep": _t(), "controlnet_cond": _randn(g, B, 4, 8, 8),
                         "encoder_hidden_states": _randn(g, B, 8, 32), "text_embedding_mask": torch.ones(B, 8),
                         "encoder_hidden_states_t5": _randn(g, B, 8, 32), "text_embedding_mask_t5": torch.ones(B, 8),
                         "image_meta_size": torch.tensor([[32, 32, 32, 32, 0, 0]] * B, dtype=torch.float32),
                         "style": torch.zeros(B, dtype=torch.long), "image_rotary_emb": _hunyuan_rope(8, 8, 2, 8)}),
    ModelSpec("T2IAdapter", "T2IAdapter", "adapter",
              dict(in_channels=3, channels=[16, 32], num_res_blocks=1, downscale_factor=4),
              lambda g: {"x": _randn(g, B, 3, 32, 32)}),
    ModelSpec("T2IAdapter-light", "T2IAdapter", "adapter",
              dict(in_channels=3, channels=[16, 32], num_res_blocks=1, downscale_factor=4, adapter_type="light_adapter"),
              lambda g: {"x": _randn(g, B, 3, 32, 32)}),
    ModelSpec("CLIPImageProjection", "CLIPImageProjection", "adapter", dict(hidden_size=32),
              lambda g: {"x": _randn(g, B, 32)}),
]


def _hunyuan_rope(h: int, w: int, patch: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    gh, gw = h // patch, w // patch
    return get_2d_rotary_pos_embed(head_dim, ((0, 0), (gh, gw)), (gh, gw))


def _stable_audio_rope(length: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    return get_1d_rotary_pos_embed(dim, length, use_real=True, repeat_interleave_real=False)


SPECS_BY_NAME = {s.name: s for s in MODEL_SPECS}


def build_model(spec: ModelSpec, seed: int) -> tuple[torch.nn.Module, int]:
    try:
        import diffusers

        cls = getattr(diffusers, spec.cls)
    except (ImportError, AttributeError) as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="missing_dependency", stage="init") from exc
    n = budget.check_budget(lambda: cls(**spec.init))
    torch.manual_seed(seed)
    try:
        model = cls(**spec.init)
    except Exception as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="init_error", stage="init") from exc
    if n is None:
        n = budget.enforce(model)
    return model.eval(), n  # diffusers models are built in float32


def build(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    spec = SPECS_BY_NAME.get(entry.model_type)
    if spec is None:
        raise ZooBuildError(f"no diffusers spec named {entry.model_type!r}", category="not_available", stage="resolve")
    model, n = build_model(spec, seed)
    inputs = spec.inputs(torch.Generator().manual_seed(seed))
    return BuiltEntry(model=model, inputs=inputs, entry=entry, num_parameters=n)
