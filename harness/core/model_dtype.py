"""What `--dtype` does to an entry's model and inputs.

`float32` and `bfloat16` cast the whole model (`model.to(dtype)`). A float8 name is float8 *storage*: the way
Diffusers users fit big transformers in memory, `enable_layerwise_casting(storage_dtype=float8_*,
compute_dtype=bfloat16)`. The model is cast to bfloat16, then its Linear, Conv and Embedding weights are stored
in float8 and cast up to bfloat16 around each layer's forward by Diffusers' hooks, on CPU and tpu alike. The
rows are judged with the bfloat16 tolerances (the arithmetic is bfloat16; float8 only changes the weights,
identically on both sides). Its float64 reference stores the very same float8 weights (rounded from the same
bfloat16 values) and computes in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLOAT8_STORAGE = ("float8_e4m3fn", "float8_e5m2")
DENOISERS = ("unet", "transformer", "prior", "decoder")  # a pipeline's components given float8 storage
MODEL_DTYPES = ("float32", "bfloat16", *FLOAT8_STORAGE)


@dataclass(frozen=True)
class LayerwiseCast:
    """float8 storage of the casting layers' weights, `compute` arithmetic (Diffusers' layerwise casting)."""

    storage: Any  # torch.dtype
    compute: Any  # torch.dtype
    via: Any = None  # dtype the model passes through first, so the float8 weights round from the same values

    def __str__(self) -> str:
        return f"{str(self.storage).removeprefix('torch.')} storage, {str(self.compute).removeprefix('torch.')} compute"


def resolve(name: str) -> Any:
    """`--dtype NAME` as a torch.dtype (whole-model cast) or a LayerwiseCast (float8 storage)."""
    import torch

    if name in ("float32", "bfloat16"):
        return getattr(torch, name)
    if name in FLOAT8_STORAGE:
        return LayerwiseCast(getattr(torch, name), torch.bfloat16)
    raise ValueError(f"unknown model dtype {name!r}: use one of {', '.join(MODEL_DTYPES)}")


def tolerance_dtype(name: str) -> str:
    """The dtype whose tolerances judge a run: the arithmetic's (bfloat16 for float8 storage)."""
    return "bfloat16" if name in FLOAT8_STORAGE else name


def is_low_precision(spec: Any) -> bool:
    import torch

    return spec is not None and spec != torch.float32


def float64_reference(spec: Any) -> Any:
    """The float64 reference's dtype for a run at `spec`: float64, with float8 storage kept for float8 runs."""
    import torch

    if isinstance(spec, LayerwiseCast):
        return LayerwiseCast(spec.storage, torch.float64, via=spec.compute)
    return torch.float64


def input_dtype(spec: Any) -> Any:
    """What floating inputs are cast to: the compute dtype."""
    return spec.compute if isinstance(spec, LayerwiseCast) else spec


def cast_model(model: Any, spec: Any) -> Any:
    """`model` (a module or a Diffusers pipeline) cast to `spec`, in place where the library casts in place."""
    if not isinstance(spec, LayerwiseCast):
        return model.to(spec)
    if spec.via is not None:
        model = model.to(spec.via)
    model = model.to(spec.compute)
    components = getattr(model, "components", None)
    if isinstance(components, dict):  # a pipeline: its denoiser, as Diffusers' docs do (pipe.transformer.enable_...)
        for name, part in components.items():
            if name in DENOISERS and _is_module(part):
                _enable(part, spec)
    else:
        _enable(model, spec)
    return model


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _enable(module: Any, spec: LayerwiseCast) -> None:
    # Diffusers' own API where the model has it (it adds the model's skip patterns and fp32 modules); its hook
    # function for anything else (Transformers, timm): the same hooks, with Diffusers' default skip patterns plus
    # the model's `_keep_in_fp32_modules`.
    if hasattr(module, "enable_layerwise_casting"):
        module.enable_layerwise_casting(storage_dtype=spec.storage, compute_dtype=spec.compute)
        return
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN, apply_layerwise_casting

    skip = tuple(DEFAULT_SKIP_MODULES_PATTERN) + tuple(getattr(module, "_keep_in_fp32_modules", None) or ())
    apply_layerwise_casting(module, storage_dtype=spec.storage, compute_dtype=spec.compute,
                            skip_modules_pattern=skip + _tied_to_skipped(module, skip))


def _cast_layers(module: Any, skip: tuple[str, ...], prefix: str = "") -> list[str]:
    """The names of the layers Diffusers' apply_layerwise_casting casts under `skip` (its own walk: a skipped
    name prunes its subtree, a supported layer is cast whole)."""
    import re

    from diffusers.hooks.layerwise_casting import _GO_LC_SUPPORTED_PYTORCH_LAYERS

    if prefix and any(re.search(p, prefix) for p in skip):
        return []
    if isinstance(module, _GO_LC_SUPPORTED_PYTORCH_LAYERS):
        return [prefix]
    return [n for name, child in module.named_children()
            for n in _cast_layers(child, skip, f"{prefix}.{name}" if prefix else name)]


def _tied_to_skipped(module: Any, skip: tuple[str, ...]) -> tuple[str, ...]:
    """Exact-name patterns for cast layers whose weight is tied to a layer left in the compute dtype (Whisper's
    `proj_out`, skipped by Diffusers' default patterns, shares `embed_tokens`' weight): casting one would hand
    the other float8 weights ("expected m1 and m2 to have the same dtype")."""
    import re

    cast = set(_cast_layers(module, skip))
    owners: dict[int, set[str]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for p in mod.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(mod_name)
    extra = set()
    for names in owners.values():
        if len(names) > 1 and names & cast and names - cast:
            extra |= names & cast
    return tuple(f"^{re.escape(n)}$" for n in sorted(extra))
