"""Shrink a transformers config to a tiny model of the same architecture.

The config's own defaults are the starting point (so every architecture-specific switch keeps its default),
then sizes are lowered by key-name rules (shrink_rules.py) and the invariants that the rules could break are
restored (shrink_invariants.py): head dims that divide, kv heads that divide heads, one layer of each kind in
`layer_types`, token ids inside the shrunk vocabulary. Sub-configs (text_config, vision_config, ...) are shrunk
recursively."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.zoo.shrink_invariants import (fix_codec_widths, fix_feature_layers, fix_feature_maps,
                                           fix_grid_pinpoints, fix_heads, fix_layer_lists, fix_out_indices,
                                           fix_stage_channels, fix_stage_lists, fix_token_ids,
                                           fix_width_copies)
from harness.zoo.shrink_rules import (DROP, MULTIPLIERS, Size, is_int, is_subconfig, shrink_int,
                                      shrink_int_list)


def shrink_dict(d: dict[str, Any], size: Size = Size(), model_type: str | None = None, *,
                _top: bool = True) -> dict[str, Any]:
    """Shrink one level of a `config.to_dict()`, recursing into sub-configs. Returns a new dict."""
    d = {k: v for k, v in d.items() if k not in DROP}
    model_type = d.get("model_type", model_type)
    old_layers = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if is_int(d.get(k))), None)
    old = dict(d)
    # Stage counts that are len(depths) etc. are geometry, not depth: keep them.
    keep = {"num_feat_extract_layers", "num_stages"}
    for lk in ("depths", "conv_dim", "hidden_sizes", "embed_dims"):
        if isinstance(d.get(lk), (list, tuple)):
            keep |= {k for k in ("num_layers", "num_stages", "num_hidden_layers") if d.get(k) == len(d[lk])}
    if old_layers is not None and any(d.get(k) == old_layers for k in keep if k in d):
        old_layers = None

    if isinstance(d.get("depths"), (list, tuple)) and len(d["depths"]) >= 3:
        # hierarchical (Swin-like) widths double per stage: start narrow so the last stage stays small
        size = dataclasses.replace(size, hidden=min(size.hidden, 2 * size.stage_width))
    for k, v in list(d.items()):
        if is_subconfig(k, v):
            d[k] = shrink_dict(v, size, _top=False)
        elif k in keep:
            continue
        elif is_int(v):
            d[k] = shrink_int(k, v, old, size)
        elif isinstance(v, float) and k in MULTIPLIERS:
            d[k] = min(v, MULTIPLIERS[k])
        elif isinstance(v, (list, tuple)) and v and all(is_int(x) for x in v):
            new = shrink_int_list(k, list(v), size)
            if new is not None:
                d[k] = new

    fix_stage_lists(d, old)
    fix_stage_channels(d, old)
    fix_width_copies(d, old)
    fix_layer_lists(d, old, old_layers, size)
    fix_out_indices(d, old, old_layers)
    fix_feature_layers(d)
    fix_grid_pinpoints(d)
    fix_feature_maps(d, old)
    fix_codec_widths(d)
    fix_heads(d, old)
    if _top:
        fix_token_ids(d)
    if "prediction_length" in d and d["prediction_length"] is None:
        d["prediction_length"] = 8  # forecasting heads refuse to exist without a horizon
    if "pad_token_id" in d and d["pad_token_id"] is None and is_int(d.get("vocab_size")):
        d["pad_token_id"] = 0  # sequence classification over a batch needs a pad token
    if is_int(d.get("window_size")) and is_int(d.get("patch_size")) and "image_size" in d and d["window_size"] > 2:
        d["window_size"] = 2  # windows must fit the 64 px grid at every stage (16, 8, 4, 2 patches)
    for k in ("use_pretrained_backbone", "use_timm_backbone"):  # never download or need timm
        if d.get(k):
            d[k] = False
    return d


_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
               "num_encoder_layers", "num_decoder_layers")


def cap_layers(d: dict[str, Any], layers: int) -> dict[str, Any]:
    """Cap only the depth of a real config (hub entries keep their widths), recursing into sub-configs;
    per-layer lists follow, keeping one layer of each kind."""
    d = {k: v for k, v in d.items() if k not in DROP}
    old_layers = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if is_int(d.get(k))), None)
    old = dict(d)
    for k, v in list(d.items()):
        if is_subconfig(k, v):
            d[k] = cap_layers(v, layers)
        elif k in _LAYER_KEYS and is_int(v):
            d[k] = min(v, layers)
    fix_layer_lists(d, old, old_layers, Size(layers=layers))
    fix_out_indices(d, old, old_layers)
    return d
