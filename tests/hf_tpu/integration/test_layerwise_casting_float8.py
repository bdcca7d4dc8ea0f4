"""Diffusers' enable_layerwise_casting with float8 storage on tpu: tiny UNet2DCondition, Flux and SD3 transformers
built from configs keep their weights in float8_e4m3fn on tpu and give CPU's bfloat16 outputs (the model run the
same way on CPU, inside cpu_reference), as Diffusers' test_layerwise_casting_inference runs them."""

from __future__ import annotations

import pytest
import torch

from hf_tpu.precision import cpu_reference

diffusers = pytest.importorskip("diffusers")


def _unet() -> tuple[torch.nn.Module, dict]:
    m = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8, norm_num_groups=4, attention_head_dim=2)
    g = torch.Generator().manual_seed(0)
    return m, {"sample": torch.randn(1, 4, 8, 8, generator=g), "timestep": torch.tensor([3]),
               "encoder_hidden_states": torch.randn(1, 3, 8, generator=g)}


def _flux() -> tuple[torch.nn.Module, dict]:
    m = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=8,
                                         pooled_projection_dim=8, axes_dims_rope=(4, 2, 2))
    g = torch.Generator().manual_seed(0)
    return m, {"hidden_states": torch.randn(1, 16, 4, generator=g),
               "encoder_hidden_states": torch.randn(1, 3, 8, generator=g),
               "pooled_projections": torch.randn(1, 8, generator=g), "timestep": torch.tensor([1.0]),
               "img_ids": torch.randn(16, 3, generator=g), "txt_ids": torch.randn(3, 3, generator=g)}


def _sd3() -> tuple[torch.nn.Module, dict]:
    m = diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16,
                                        joint_attention_dim=8, pooled_projection_dim=8, out_channels=4,
                                        pos_embed_max_size=16)
    g = torch.Generator().manual_seed(0)
    return m, {"hidden_states": torch.randn(1, 4, 8, 8, generator=g),
               "encoder_hidden_states": torch.randn(1, 3, 8, generator=g),
               "pooled_projections": torch.randn(1, 8, generator=g), "timestep": torch.tensor([1.0])}


def _cast(inputs: dict, device: str) -> dict:
    return {k: (v.bfloat16() if v.is_floating_point() else v).to(device) for k, v in inputs.items()}


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("make", [_unet, _flux, _sd3], ids=["unet2d_condition", "flux", "sd3"])
def test_float8_storage_matches_cpu(make) -> None:
    torch.manual_seed(0)
    cpu_model, inputs = make()
    torch.manual_seed(0)
    tpu_model, _ = make()
    cpu_model.to(dtype=torch.bfloat16)
    tpu_model.to("tpu", dtype=torch.bfloat16)
    for m in (cpu_model, tpu_model):
        m.eval().enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    stored = {p.dtype for p in tpu_model.parameters()}
    assert torch.float8_e4m3fn in stored and all(p.device.type == "tpu" for p in tpu_model.parameters())
    with cpu_reference(), torch.no_grad():
        expected = cpu_model(**_cast(inputs, "cpu")).sample
    with torch.no_grad():
        actual = tpu_model(**_cast(inputs, "tpu")).sample
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert {p.dtype for p in tpu_model.parameters()} == stored  # back in float8 after the forward
    # bfloat16 compute through a whole (tiny) network: a few bfloat16 ulps of its largest output
    torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=0.05,
                               atol=0.05 * float(expected.float().abs().max()))
