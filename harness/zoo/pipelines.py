"""Tiny diffusers pipelines, assembled offline from tiny models and tokenizers built in code.

`BuiltEntry.model` is the pipeline; move it with `pipe.to(device)`. `inputs` are plain Python values and
`call` passes a fresh CPU `torch.Generator` seeded with the build seed, so every call draws the same noise
wherever the pipeline runs. Images come back as tensors (`output_type="pt"`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from harness.zoo import budget
from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry

PROMPT = "a photo of a cat"
STEPS = 2
SIZE = 32  # pixels; latents are SIZE / 4 with the two-block VAE


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    cls: str
    components: Callable[[], dict[str, Any]]
    inputs: Callable[[], dict[str, Any]]


# ---------------------------------------------------------------- tokenizers and text encoders, built in code

def clip_tokenizer(max_length: int = 16) -> Any:
    """A character-level CLIP BPE tokenizer (no merges): offline, deterministic, ~90 tokens."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'":
        vocab[ch] = len(vocab)
        vocab[ch + "</w>"] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=[])
    tok.model_max_length = max_length
    return tok


def t5_tokenizer(max_length: int = 16) -> Any:
    """A unigram T5 tokenizer over single characters, built in code."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    pieces += [(ch, -2.0) for ch in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'"]
    tok = T5Tokenizer(vocab=pieces, extra_ids=0)
    tok.model_max_length = max_length
    return tok


def clip_text(vocab: int, with_projection: bool = False, hidden: int = 32, projection: int = 32) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=hidden, intermediate_size=37,
                            num_attention_heads=4, num_hidden_layers=2, vocab_size=vocab, max_position_embeddings=16,
                            projection_dim=projection)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def t5_encoder(vocab: int, d_model: int = 32) -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab, d_model=d_model, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1))


def _model(name: str, **changes: Any) -> torch.nn.Module:
    import diffusers

    from harness.zoo.diffusers_zoo import SPECS_BY_NAME

    spec = SPECS_BY_NAME[name]
    return getattr(diffusers, spec.cls)(**{**spec.init, **changes})


def _scheduler(name: str = "DDIMScheduler", **kw: Any) -> Any:
    import diffusers

    return getattr(diffusers, name)(**kw)


# ---------------------------------------------------------------- component sets

def _sd(unet_in: int = 4, scheduler: str = "DDIMScheduler") -> dict[str, Any]:
    tok = clip_tokenizer()
    return dict(unet=_model("UNet2DConditionModel", in_channels=unet_in), vae=_model("AutoencoderKL"),
                text_encoder=clip_text(len(tok)), tokenizer=tok, scheduler=_scheduler(scheduler),
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def _sd_controlnet() -> dict[str, Any]:
    return {**_sd(), "controlnet": _model("ControlNetModel")}


def _sdxl() -> dict[str, Any]:
    tok = clip_tokenizer()
    return dict(unet=_model("UNet2DConditionModel-sdxl", cross_attention_dim=64, projection_class_embeddings_input_dim=80),
                vae=_model("AutoencoderKL"), text_encoder=clip_text(len(tok)), tokenizer=tok,
                text_encoder_2=clip_text(len(tok), with_projection=True), tokenizer_2=clip_tokenizer(),
                scheduler=_scheduler("EulerDiscreteScheduler"))


def _sd3() -> dict[str, Any]:
    tok = clip_tokenizer()
    t5 = t5_tokenizer()
    return dict(transformer=_model("SD3Transformer2DModel", joint_attention_dim=32, pooled_projection_dim=64),
                vae=_model("AutoencoderKL", use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0),
                text_encoder=clip_text(len(tok), with_projection=True), tokenizer=tok,
                text_encoder_2=clip_text(len(tok), with_projection=True), tokenizer_2=clip_tokenizer(),
                text_encoder_3=t5_encoder(len(t5)), tokenizer_3=t5,
                scheduler=_scheduler("FlowMatchEulerDiscreteScheduler"))


def _flux() -> dict[str, Any]:
    tok = clip_tokenizer()
    t5 = t5_tokenizer()
    return dict(transformer=_model("FluxTransformer2DModel", joint_attention_dim=32, pooled_projection_dim=32),
                vae=_model("AutoencoderKL", use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0),
                text_encoder=clip_text(len(tok), with_projection=False), tokenizer=tok,
                text_encoder_2=t5_encoder(len(t5)), tokenizer_2=t5,
                scheduler=_scheduler("FlowMatchEulerDiscreteScheduler"))


def _pixart() -> dict[str, Any]:
    t5 = t5_tokenizer()
    return dict(transformer=_model("PixArtTransformer2DModel", cross_attention_dim=16, caption_channels=32),
                vae=_model("AutoencoderKL"), text_encoder=t5_encoder(len(t5)), tokenizer=t5,
                scheduler=_scheduler("DPMSolverMultistepScheduler"))


def _unconditional(scheduler: str, **kw: Any) -> dict[str, Any]:
    return dict(unet=_model("UNet2DModel"), scheduler=_scheduler(scheduler, **kw))


def _ldm() -> dict[str, Any]:
    return dict(vqvae=_model("VQModel", latent_channels=3),
                unet=_model("UNet2DModel", in_channels=3, out_channels=3, sample_size=16),
                scheduler=_scheduler("DDIMScheduler"))


def _dit() -> dict[str, Any]:
    return dict(transformer=_model("DiTTransformer2DModel"), vae=_model("AutoencoderKL"),
                scheduler=_scheduler("DDIMScheduler"),
                id2label={i: f"class{i}" for i in range(10)})


def _dance() -> dict[str, Any]:
    return dict(unet=_model("UNet1DModel"),
                scheduler=_scheduler("IPNDMScheduler"))


def _consistency() -> dict[str, Any]:
    return dict(unet=_model("UNet2DModel"), scheduler=_scheduler("CMStochasticIterativeScheduler"))


def _image(seed: int = 0) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def _text(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "num_inference_steps": STEPS, "height": SIZE, "width": SIZE, "output_type": "pt", **extra}


PIPELINE_SPECS: list[PipelineSpec] = [
    PipelineSpec("StableDiffusionPipeline", "StableDiffusionPipeline", _sd, _text),
    PipelineSpec("StableDiffusionImg2ImgPipeline", "StableDiffusionImg2ImgPipeline", _sd,
                 lambda: {"prompt": PROMPT, "image": _image(), "num_inference_steps": STEPS, "strength": 1.0,
                          "output_type": "pt"}),
    PipelineSpec("StableDiffusionInpaintPipeline", "StableDiffusionInpaintPipeline", partial(_sd, unet_in=9),
                 lambda: _text(image=_image(), mask_image=_image(1))),
    PipelineSpec("StableDiffusionControlNetPipeline", "StableDiffusionControlNetPipeline", _sd_controlnet,
                 lambda: _text(image=_image())),
    PipelineSpec("StableDiffusionPipeline-euler", "StableDiffusionPipeline", partial(_sd, scheduler="EulerDiscreteScheduler"), _text),
    PipelineSpec("StableDiffusionPipeline-dpm", "StableDiffusionPipeline",
                 partial(_sd, scheduler="DPMSolverMultistepScheduler"), _text),
    PipelineSpec("StableDiffusionXLPipeline", "StableDiffusionXLPipeline", _sdxl, _text),
    PipelineSpec("StableDiffusion3Pipeline", "StableDiffusion3Pipeline", _sd3, _text),
    PipelineSpec("FluxPipeline", "FluxPipeline", _flux, lambda: _text(max_sequence_length=16)),
    PipelineSpec("PixArtAlphaPipeline", "PixArtAlphaPipeline", _pixart,
                 lambda: _text(use_resolution_binning=False, max_sequence_length=16)),
    PipelineSpec("DDPMPipeline", "DDPMPipeline", partial(_unconditional, "DDPMScheduler", num_train_timesteps=10),
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("DDIMPipeline", "DDIMPipeline", partial(_unconditional, "DDIMScheduler"),
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("PNDMPipeline", "PNDMPipeline", partial(_unconditional, "PNDMScheduler", skip_prk_steps=True),
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("ScoreSdeVePipeline", "ScoreSdeVePipeline", partial(_unconditional, "ScoreSdeVeScheduler"),
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("LDMPipeline", "LDMPipeline", _ldm,
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("DiTPipeline", "DiTPipeline", _dit,
                 lambda: {"class_labels": [1], "num_inference_steps": STEPS, "output_type": "np"}),
    PipelineSpec("DanceDiffusionPipeline", "DanceDiffusionPipeline", _dance,
                 lambda: {"batch_size": 1, "num_inference_steps": STEPS, "audio_length_in_s": 512 / 16000}),
    PipelineSpec("ConsistencyModelPipeline", "ConsistencyModelPipeline", _consistency,
                 lambda: {"batch_size": 1, "num_inference_steps": 1, "output_type": "np"}),
]
SPECS = {p.name: p for p in PIPELINE_SPECS}


def call_pipeline(pipe: Any, inputs: dict[str, Any], seed: int = 0) -> Any:
    """Run a pipeline with a fresh CPU generator (same noise on any device the pipeline was moved to), every
    draw made in float32 (`float32_draws`), so the float32 baseline, the float64 reference and the backend
    runs all get the same initial latents and the same per-step noise."""
    with float32_draws():
        return pipe(**inputs, generator=torch.Generator("cpu").manual_seed(seed))


@contextlib.contextmanager
def float32_draws() -> Iterator[None]:
    """Diffusers' `randn_tensor` draws in the run's dtype, and PyTorch's CPU generator consumes 64-bit draws
    for float64 but 32-bit ones for float32: a float64 pipeline would get other noise than the float32
    baseline, and a float64 reference would compare nothing. Within this block every `randn_tensor` (the
    initial latents and the schedulers' step noise alike) draws in float32 and casts to the dtype asked for.
    Passing `latents=` would cover only the initial latents, and not every pipeline accepts it (DDPMPipeline).
    The function is replaced where the pipeline and scheduler modules imported it by name."""
    import sys

    from diffusers.utils import torch_utils

    original = torch_utils.randn_tensor

    def randn_tensor(shape, generator=None, device=None, dtype=None, layout=None):
        if dtype is None or dtype == torch.float32 or not dtype.is_floating_point:
            return original(shape, generator=generator, device=device, dtype=dtype, layout=layout)
        return original(shape, generator=generator, device=device, dtype=torch.float32, layout=layout).to(dtype)

    patched = [m for name, m in list(sys.modules.items())
               if name.startswith("diffusers") and getattr(m, "randn_tensor", None) is original]
    for m in patched:
        m.randn_tensor = randn_tensor
    try:
        yield
    finally:
        for m in patched:
            m.randn_tensor = original


def build_pipeline(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    spec = SPECS.get(entry.model_type)
    if spec is None:
        raise ZooBuildError(f"no pipeline spec named {entry.model_type!r}", category="not_available", stage="resolve")
    try:
        import diffusers

        cls = getattr(diffusers, spec.cls)
    except (ImportError, AttributeError) as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="missing_dependency", stage="init") from exc
    torch.manual_seed(seed)
    try:
        pipe = cls(**spec.components())
    except Exception as exc:
        category = "missing_dependency" if isinstance(exc, ImportError) else "init_error"
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category=category, stage="init") from exc
    modules = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
    n = sum(budget.count(m) for m in modules)
    if n > budget.DEFAULT_BUDGET:
        raise ZooBuildError(f"{n:,} parameters > budget {budget.DEFAULT_BUDGET:,}", category="over_budget", stage="init")
    for m in modules:
        m.eval()  # built in float32 already; .to() would warn about fp32-pinned modules
    pipe.set_progress_bar_config(disable=True)
    return BuiltEntry(model=pipe, inputs=spec.inputs(), call=partial(call_pipeline, seed=seed), entry=entry,
                      num_parameters=n)
