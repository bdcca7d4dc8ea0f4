"""One generic rule that makes a random-init model's outputs carry information: weights the model
zero-initialises on purpose get small random values.

Zero initialisation is a training device (ControlNet's zero convolutions, DiT's adaLN-zero modulations,
zero-init output projections and layer-scale gates): at init the branch contributes exactly nothing, so its
output is all zeros and any backend "matches" it. Diffusers' own Multi-ControlNet tests re-initialise the
zero convolutions before comparing, for the same reason.

The rule: every floating parameter that is entirely zero, except biases (a zero bias is the ordinary
default, and a random weight in front of it already makes the branch non-zero), is redrawn from
N(0, STD^2) with a generator seeded from the entry's seed, so the model stays deterministic per seed.
"""

from __future__ import annotations

from typing import Any

import torch

STD = 0.02  # transformers' default initializer_range: small, like a trained model's weights


def zero_initialised(module: torch.nn.Module) -> list[str]:
    """Names of the parameters the rule applies to."""
    return [name for name, p in module.named_parameters()
            if p.is_floating_point() and p.numel() > 0 and not name.endswith("bias") and not bool(p.detach().any())]


def reinit_zero_weights(module: Any, seed: int = 0) -> list[str]:
    """Apply the rule to `module` (an nn.Module; other objects are left alone). Returns the names changed."""
    if not isinstance(module, torch.nn.Module):
        return []
    names = zero_initialised(module)
    if not names:
        return []
    g = torch.Generator().manual_seed(seed + 12345)
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in names:
            p = params[name]
            p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float32) * STD).to(p.dtype))
    return names
