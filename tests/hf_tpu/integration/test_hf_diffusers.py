"""Issue 3, point 5: Diffusers pipelines and models on tpu (`pipe.to("tpu")`), against CPU."""

import pytest
import torch
from _hf_diffusers_tiny import ddpm, flux_transformer, sd3_transformer, sd_call, stable_diffusion

# Image tolerances (max abs difference, images in [0, 1]); see docs/integration.md.
IMAGE_ATOL_HIGHEST = 1e-4
IMAGE_ATOL_MEDIUM = 2e-2


@pytest.fixture(scope="module")
def sd_reference():
    pipe = stable_diffusion()
    ref = pipe(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    return pipe, ref


def test_stable_diffusion_pipeline_on_tpu_matches_cpu(sd_reference, precision):
    pipe, ref = sd_reference
    pipe.to("tpu")
    assert pipe.device.type == "tpu"
    assert all(p.device.type == "tpu" for m in (pipe.unet, pipe.vae, pipe.text_encoder) for p in m.parameters())
    precision("highest")
    out = pipe(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    assert out.device.type == "tpu" and out.shape == ref.shape == (1, 3, 32, 32)
    err = (out.cpu() - ref).abs().max().item()
    print(f"\nStableDiffusionPipeline highest: max abs image difference {err:.2e}")
    assert err <= IMAGE_ATOL_HIGHEST


@pytest.mark.slow
def test_stable_diffusion_medium_precision(sd_reference, precision):
    pipe, ref = sd_reference
    pipe.to("tpu")
    precision("medium")
    out = pipe(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    err = (out.cpu() - ref).abs().max().item()
    print(f"\nStableDiffusionPipeline medium: max abs image difference {err:.2e}")
    assert err <= IMAGE_ATOL_MEDIUM


def test_tpu_generator_draws_reproducible_latents():
    """Diffusers draws latents on the generator's device: a tpu generator draws on tpu, reseeding repeats."""
    from diffusers.utils.torch_utils import randn_tensor

    g = torch.Generator(device="tpu").manual_seed(0)
    a = randn_tensor((1, 4, 8, 8), generator=g, device=torch.device("tpu"))
    b = randn_tensor((1, 4, 8, 8), generator=g, device=torch.device("tpu"))
    g.manual_seed(0)
    again = randn_tensor((1, 4, 8, 8), generator=g, device=torch.device("tpu"))
    assert a.device.type == "tpu" and torch.equal(a.cpu(), again.cpu()) and not torch.equal(a.cpu(), b.cpu())


def test_diffusion_pipeline_from_pretrained_to_tpu(sd_reference, tmp_path, highest):
    import diffusers

    pipe, ref = sd_reference
    pipe.to("cpu").save_pretrained(tmp_path)
    loaded = diffusers.DiffusionPipeline.from_pretrained(tmp_path).to("tpu")
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded).__name__ == "StableDiffusionPipeline" and loaded.device.type == "tpu"
    out = loaded(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    assert (out.cpu() - ref).abs().max().item() <= IMAGE_ATOL_HIGHEST


def test_ddpm_pipeline_on_tpu_matches_cpu(highest):
    pipe = ddpm()
    kw = dict(batch_size=2, num_inference_steps=2, output_type="np")
    ref = pipe(**kw, generator=torch.Generator().manual_seed(0)).images
    pipe.to("tpu")
    assert pipe.unet.device.type == "tpu"
    out = pipe(**kw, generator=torch.Generator().manual_seed(0)).images
    assert out.shape == ref.shape == (2, 8, 8, 4)
    assert abs(out - ref).max() <= IMAGE_ATOL_HIGHEST


@pytest.mark.parametrize("build", [flux_transformer, sd3_transformer], ids=["flux", "sd3"])
def test_diffusion_transformer_forward_on_tpu(build, highest):
    model, x = build()
    with torch.no_grad():
        ref = model(**x).sample
        model.to("tpu")
        out = model(**{k: v.to("tpu") for k, v in x.items()}).sample
    assert out.device.type == "tpu" and out.shape == ref.shape
    assert ((out.cpu() - ref).abs().max() / ref.abs().max()).item() <= 1e-4
