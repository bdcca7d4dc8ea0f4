"""One generic rule that makes a random-init model's outputs carry information: weights the model
zero-initialises on purpose get small random values.

Zero initialisation is a training device (ControlNet's zero convolutions, DiT's adaLN-zero modulations,
zero-init output projections and layer-scale gates): at init the branch contributes exactly nothing, so its
output is all zeros and any backend "matches" it. Diffusers' own Multi-ControlNet tests re-initialise the
zero convolutions before comparing, for the same reason.

The rule: every floating parameter that is entirely zero, except biases (a zero bias is the ordinary
default, and a random weight in front of it already makes the branch non-zero), is redrawn from
N(0, STD^2) with a generator seeded from the entry's seed, so the model stays deterministic per seed.

Codebooks: the vector quantisers of audio codecs (Encodec, Mimi, WavTokenizer, Xcodec: *EuclideanCodebook)
keep their centroids in buffers that start at zero, learnt by k-means during training. With every centroid
at zero, every frame maps to code 0 and the decoded audio is the same whatever the input (Mimi and
WavTokenizer were "uninformative: unchanged when the input changes"). A floating table buffer (2-D or more)
of a module whose class is a codebook that is entirely zero is drawn from N(0, STD^2) too: small centroids,
so which one is nearest depends on the direction of a frame's latent, not on the centroids' own norms
(with unit-scale centroids WavTokenizer's ~0.04-scale latents all picked the shortest); a centroid cache
derived at first use
(Mimi's `_embed`, filled by the builder's input probes) is dropped so that it is derived again.
"""

from __future__ import annotations

from typing import Any

import torch

STD = 0.02  # transformers' default initializer_range: small, like a trained model's weights


def zero_initialised(module: torch.nn.Module) -> list[str]:
    """Names of the parameters the rule applies to."""
    return [name for name, p in module.named_parameters()
            if p.is_floating_point() and p.numel() > 0 and not name.endswith("bias") and not bool(p.detach().any())]


_CENTROID_CACHES = ("_embed",)


def zero_codebooks(module: torch.nn.Module) -> list[str]:
    """Names of the codebook buffers the rule applies to."""
    out = []
    for prefix, m in module.named_modules():
        if "codebook" not in type(m).__name__.lower():
            continue
        for name, b in m.named_buffers(recurse=False):
            if b.is_floating_point() and b.dim() >= 2 and b.numel() > 0 and not bool(b.detach().any()):
                out.append(f"{prefix}.{name}" if prefix else name)
    return out


def reinit_zero_weights(module: Any, seed: int = 0) -> list[str]:
    """Apply the rule to `module` (an nn.Module; other objects are left alone). Returns the names changed."""
    if not isinstance(module, torch.nn.Module):
        return []
    names = zero_initialised(module)
    codebooks = zero_codebooks(module)
    if not names and not codebooks:
        return []
    g = torch.Generator().manual_seed(seed + 12345)
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in names:
            p = params[name]
            p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float32) * STD).to(p.dtype))
        if codebooks:
            buffers = dict(module.named_buffers())
            owners = dict(module.named_modules())
            for name in codebooks:
                b = buffers[name]
                b.copy_((torch.randn(b.shape, generator=g, dtype=torch.float32) * STD).to(b.dtype))
                owner = owners[name.rpartition(".")[0]]
                for cache in _CENTROID_CACHES:
                    if getattr(owner, cache, None) is not None:
                        setattr(owner, cache, None)
    return names + codebooks
