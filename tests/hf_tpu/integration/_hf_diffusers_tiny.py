"""Tiny Diffusers components built in code (random weights), shared by the Diffusers integration tests."""

from __future__ import annotations

from typing import Any

import torch

PROMPT = "a cat"


def _df() -> Any:
    import diffusers

    diffusers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.set_verbosity_error()
    return diffusers


def clip_tokenizer() -> Any:
    """Transformers v5's CLIPTokenizer over an in-memory character vocabulary (no merges)."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab[ch] = len(vocab)
        vocab[ch + "</w>"] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=[])
    tok.model_max_length = 8
    return tok


def stable_diffusion() -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    df = _df()
    torch.manual_seed(0)
    tok = clip_tokenizer()
    text = CLIPTextModel(CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32,
                                        intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                                        vocab_size=len(tok), max_position_embeddings=8))
    unet = df.UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                   block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                   attention_head_dim=8, norm_num_groups=8)
    vae = df.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                           norm_num_groups=4, layers_per_block=1, sample_size=32,
                           down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    pipe = df.StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text, tokenizer=tok,
                                      scheduler=df.DDIMScheduler(), safety_checker=None, feature_extractor=None,
                                      requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd_call() -> dict[str, Any]:
    return dict(prompt=PROMPT, num_inference_steps=2, height=32, width=32, output_type="pt")


def ddpm() -> Any:
    """UNet2DModel with the SD UNet's channels and latent size, so its eager ops reuse the same programs."""
    df = _df()
    torch.manual_seed(0)
    unet = df.UNet2DModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
                          norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                          up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    pipe = df.DDPMPipeline(unet=unet, scheduler=df.DDPMScheduler(num_train_timesteps=10))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_transformer() -> tuple[Any, dict[str, torch.Tensor]]:
    df = _df()
    torch.manual_seed(0)
    model = df.FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                      attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                      pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(4, 4, 3)
    ids[..., 1] = torch.arange(4)[:, None]
    ids[..., 2] = torch.arange(4)[None, :]
    inputs = {"hidden_states": torch.randn(1, 16, 16, generator=g), "encoder_hidden_states": torch.randn(1, 8, 32, generator=g),
              "pooled_projections": torch.randn(1, 32, generator=g), "timestep": torch.full((1,), 0.5),
              "img_ids": ids.reshape(16, 3), "txt_ids": torch.zeros(8, 3)}
    return model, inputs


def sd3_transformer() -> tuple[Any, dict[str, torch.Tensor]]:
    df = _df()
    torch.manual_seed(0)
    model = df.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
                                     num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                     pooled_projection_dim=32, out_channels=4, pos_embed_max_size=8).eval()
    g = torch.Generator().manual_seed(0)
    inputs = {"hidden_states": torch.randn(1, 4, 8, 8, generator=g), "encoder_hidden_states": torch.randn(1, 8, 32, generator=g),
              "pooled_projections": torch.randn(1, 32, generator=g), "timestep": torch.tensor([10])}
    return model, inputs
