"""The invariants the shrinking rules (shrink_rules.py) can break, restored after them (shrink.py): per-layer
lists that follow the new depth, stage lists and feature maps that agree, head dims that divide and kv heads
that divide heads, multimodal RoPE sections, token ids inside the shrunk vocabulary."""

from __future__ import annotations

import math
import re
from typing import Any

from harness.zoo.shrink_rules import (KEEP_LENGTH, R_EXPERTS, R_HIDDEN, R_KV_HEADS, R_STAGE_DEPTHS,
                                      R_STAGE_HEADS, R_STAGE_WIDTHS, R_TOKEN_ID, R_TOP_K, Size,
                                      cut_layer_list, is_int, is_subconfig, shrink_int, subconfigs)


def fix_layer_lists(d: dict[str, Any], old: dict[str, Any], old_layers: int | None, size: Size) -> None:
    """Per-layer lists (layer_types, per-layer windows...) follow the new layer count."""
    if not old_layers or old_layers <= size.layers:
        return
    layer_key = next(k for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if d.get(k) is not None)
    n = d[layer_key]
    for k, v in list(d.items()):
        # {"05": {...}, "11": {...}}: per-layer overrides keyed by layer index; keep one, on the last layer
        if isinstance(v, dict) and v and all(str(x).isdigit() and isinstance(y, dict) for x, y in v.items()) \
                and max(int(x) for x in v) >= n:
            first = sorted(v, key=int)[0]
            sub = {kk: (shrink_int(kk, vv, v[first], size) if is_int(vv) else vv) for kk, vv in v[first].items()}
            if is_int(sub.get("num_key_value_heads")) and v[first].get("num_key_value_heads") == \
                    v[first].get("num_attention_heads"):
                sub["num_key_value_heads"] = sub["num_attention_heads"]  # multi-head stays multi-head
            d[k] = {str(n - 1).zfill(len(first)): sub}
    per_layer = [k for k, v in d.items() if isinstance(v, (list, tuple)) and len(v) == old_layers
                 and k not in KEEP_LENGTH and not R_STAGE_WIDTHS.match(k) and not R_STAGE_HEADS.match(k)]
    patterns = [k for k, v in d.items() if isinstance(v, str) and len(v) == old_layers and "pattern" in k]
    for k in per_layer:
        if all(isinstance(x, str) for x in d[k]):
            n = max(n, len(set(d[k])))
    for k in patterns:  # "M-M*-M-" style hybrid patterns: one character per layer
        n = max(n, len(set(d[k])))
    for k in patterns:
        d[k] = "".join(cut_layer_list(list(d[k]), n))
    for k, v in list(d.items()):
        # explicit indices of the layers of one kind (attention layers of a Mamba hybrid): keep one, the last
        if k.endswith(("layer_indices", "layer_ids")) and isinstance(v, (list, tuple)) and v and all(is_int(x) for x in v) \
                and max(v) >= n:
            d[k] = sorted({min(x, n - 1) for x in v})[-1:]
    for k in per_layer:
        cut = cut_layer_list(list(d[k]), n)
        d[k] = cut if len(cut) == n else (cut + list(d[k])[len(cut):])[:n]
    d[layer_key] = n


def fix_out_indices(d: dict[str, Any], old: dict[str, Any], old_layers: int | None) -> None:
    """Backbone outputs of a plain (stem + N layers) encoder: keep as many feature maps as before, taken from
    the last layers, adding layers if the shrunk depth is smaller than the number of outputs."""
    bidx = d.get("backbone_out_indices")
    layer_key = next((k for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if is_int(d.get(k))), None)
    if isinstance(bidx, (list, tuple)) and bidx and layer_key and max(bidx) >= d[layer_key]:
        # zero-based layer indices (DPT-style): keep their number, from the last layers
        n = max(d[layer_key], len(bidx))
        d[layer_key] = n
        d["backbone_out_indices"] = list(range(n - len(bidx), n))
    idx = d.get("out_indices")
    feats = d.get("out_features")
    if not old_layers or not (isinstance(idx, (list, tuple)) or isinstance(feats, (list, tuple))):
        return
    stage_names = old.get("stage_names")
    if not (isinstance(stage_names, list) and len(stage_names) == old_layers + 1):
        return  # hierarchical backbone: stages come from `depths`, untouched by the layer count
    if not isinstance(idx, (list, tuple)):
        idx = [stage_names.index(f) for f in feats]
    if max(idx) <= 0:
        return
    layer_key = next(k for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if is_int(d.get(k)))
    k = len(idx)
    n = max(d[layer_key], k)
    d[layer_key] = n
    d["out_indices"] = list(range(n - k + 1, n + 1))
    d["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, n + 1)]
    d["out_features"] = [f"stage{i}" for i in d["out_indices"]]


def old_hidden_of(old: dict[str, Any]) -> int:
    return next((old[k] for k in ("hidden_size", "d_model") if is_int(old.get(k))), 0)


def fix_stage_lists(d: dict[str, Any], old: dict[str, Any]) -> None:
    """A stem width that was the first stage's width stays so; block indices stay inside the fewer blocks."""
    for k, v in d.items():
        if R_STAGE_WIDTHS.match(k) and isinstance(v, list) and v and isinstance(old.get(k), list) and v != old[k]:
            for hk in ("hidden_size", "embed_dim", "embedding_size", "stem_out_channels"):
                if is_int(d.get(hk)) and old.get(hk) == old[k][0]:
                    d[hk] = v[0]
    depth_key = next((k for k in d if R_STAGE_DEPTHS.match(k) and isinstance(d[k], list)
                      and all(is_int(x) for x in d[k])), None)
    blocks = d.get("global_attention_blocks")
    if depth_key and isinstance(blocks, list) and blocks and all(is_int(x) for x in blocks):
        _move_global_blocks(d, depth_key, old.get(depth_key), blocks)
    if isinstance(d.get("window_size_per_stage"), list):
        d["window_size_per_stage"] = [min(x, 2) if is_int(x) else x for x in d["window_size_per_stage"]]


def fix_width_copies(d: dict[str, Any], old: dict[str, Any]) -> None:
    """A list repeating one hidden width ([256, 256, 256] = d_model per feature level, a DETR decoder's inputs =
    the encoder's hidden width) follows that width, and so does a group count equal to it."""
    for k, v in list(d.items()):
        if not (isinstance(v, list) and v and v == old.get(k) and all(is_int(x) for x in v) and len(set(v)) == 1):
            continue
        width = next((d[h] for h in d if R_HIDDEN.match(h) and is_int(d[h]) and old.get(h) == v[0] != d[h]), None)
        if width is not None:
            d[k] = [width] * len(v)
    hidden = next((h for h in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if is_int(d.get(h))), None)
    for k, v in list(d.items()):
        # depthwise convolutions (Mimi-style upsampling): one group per channel of the hidden width
        if hidden and k.endswith("_groups") and is_int(v) and v == old.get(hidden) != d[hidden]:
            d[k] = d[hidden]


def _move_global_blocks(d: dict[str, Any], depth_key: str, old_depths: Any, blocks: list[int]) -> None:
    """Global-attention block indices keep their stage and their place in it: a block that was not the first
    of its stage stays so (Hiera's first block of a stage pools its queries with a window, which a global
    block does not have), giving that stage a second block if needed."""
    depths = list(d[depth_key])
    if not (isinstance(old_depths, list) and len(old_depths) == len(depths)):
        d["global_attention_blocks"] = sorted({min(x, sum(depths) - 1) for x in blocks})
        return
    places = set()
    for x in blocks:
        stage = next((i for i in range(len(old_depths)) if x < sum(old_depths[: i + 1])), len(old_depths) - 1)
        offset = min(x - sum(old_depths[:stage]), 1)  # first block of the stage, or a later one
        depths[stage] = max(depths[stage], offset + 1)
        places.add((stage, offset))
    d[depth_key] = depths
    d["global_attention_blocks"] = sorted(sum(depths[:stage]) + offset for stage, offset in places)


def fix_codec_widths(d: dict[str, Any]) -> None:
    """Neural audio codec encoders double their base width at each downsampling stage: cap the base so the
    deepest stage stays 128 channels wide."""
    ratios = next((d[k] for k in ("downsampling_ratios", "upsampling_ratios") if isinstance(d.get(k), (list, tuple))
                   and d[k]), None)
    if ratios is None:
        return
    for k in ("num_filters", "encoder_hidden_size"):
        if is_int(d.get(k)):
            d[k] = max(1, min(d[k], 128 >> len(ratios)))


def _side(v: Any) -> int | None:
    """One side of an image size given as an int or [h, w]."""
    if isinstance(v, (list, tuple)) and v and is_int(v[-1]):
        v = v[-1]
    return v if is_int(v) and v > 0 else None


def fix_feature_maps(d: dict[str, Any], old: dict[str, Any]) -> None:
    """Sizes derived from the image or from a sub-config's widths follow them: a patch grid side
    (image_size / patch_size), feature-map sides of a backbone (scaled with its image) and an FPN's input
    channels (the backbone's stage widths, deepest first)."""
    if is_int(old.get("image_size")) and not is_int(d.get("patch_size")):
        # an image size that repeats a sub-config's (its vision tower's) follows that one's patch rounding
        same = [new.get("image_size") for new, was in _paired_subconfigs(d, old) if was.get("image_size") ==
                old["image_size"] and is_int(new.get("image_size"))]
        if same:
            d["image_size"] = min(same)
    image, patch = _side(d.get("image_size")), _side(d.get("patch_size"))
    old_image, old_patch = _side(old.get("image_size")), _side(old.get("patch_size"))
    if image and patch and old_image and old_patch and old.get("image_embedding_size") == old_image // old_patch:
        d["image_embedding_size"] = image // patch
    backbone, old_backbone = d.get("backbone_config"), old.get("backbone_config")
    if not (isinstance(backbone, dict) and isinstance(old_backbone, dict)):
        return
    image, old_image = _side(backbone.get("image_size")), _side(old_backbone.get("image_size"))
    patch, old_patch = _side(backbone.get("patch_size")), _side(old_backbone.get("patch_size"))
    if image and old_image and patch and patch == old_patch:
        image, old_image = image // patch, old_image // patch  # scale whole patch grids
    sizes = d.get("backbone_feature_sizes")
    if image and old_image and isinstance(sizes, list) and all(isinstance(x, list) for x in sizes):
        d["backbone_feature_sizes"] = [[max(1, x * image // old_image) for x in hw] for hw in sizes]
    widths, old_widths = backbone.get("hidden_sizes"), old_backbone.get("hidden_sizes")
    enc = old.get("encoder_in_channels")
    if isinstance(widths, list) and isinstance(old_widths, list) and isinstance(enc, list) and enc \
            and len(enc) <= len(old_widths) and enc == old_widths[-len(enc):]:
        d["encoder_in_channels"] = widths[-len(enc):]  # DETR-style encoders read the last backbone stages
    channels = d.get("backbone_channel_list")
    for key in ("embed_dim_per_stage", "hidden_sizes", "embed_dims"):
        widths, old_widths = backbone.get(key), old_backbone.get(key)
        if isinstance(channels, list) and isinstance(widths, list) and isinstance(old_widths, list) \
                and channels == old_widths[::-1]:
            d["backbone_channel_list"] = widths[::-1]


def _paired_subconfigs(d: dict[str, Any], old: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(shrunk, original) pairs of every sub-config below `d`."""
    out = []
    for k, v in d.items():
        if is_subconfig(k, v) and isinstance(old.get(k), dict):
            out += [(v, old[k])] + _paired_subconfigs(v, old[k])
    return out


_STAGE_CHANNELS = re.compile(r"^(stem|stage)_(\w+_)?channels$")


def fix_stage_channels(d: dict[str, Any], old: dict[str, Any]) -> None:
    """HGNet-style per-stage in/mid/out channel lists chain into each other (a stage's input is the previous
    one's output, the first's is the stem's): scale them all by one factor, the one that shrank the last stage
    width they report in `hidden_sizes`, so the chain and that report stay equal. Layers per block follow the
    depths."""
    keys = [k for k, v in d.items() if _STAGE_CHANNELS.match(k) and isinstance(v, list) and v
            and all(is_int(x) for x in v)]
    if "stage_in_channels" not in keys:
        return  # other families give their widths in block tables that these lists must keep matching
    widths, old_widths, outs = d.get("hidden_sizes"), old.get("hidden_sizes"), old.get("stage_out_channels")
    if isinstance(widths, list) and widths and isinstance(outs, list) and old_widths and old_widths[-1] == outs[-1]:
        factor = old_widths[-1] / widths[-1]
    else:
        factor = max(1.0, max(max(d[k]) for k in keys) / 256)
    for k in keys:
        d[k] = [max(1, round(x / factor)) if x > 8 else x for x in d[k]]
    if isinstance(d.get("stage_numb_of_layers"), list):
        d["stage_numb_of_layers"] = [min(x, 2) if is_int(x) else x for x in d["stage_numb_of_layers"]]


def fix_feature_layers(d: dict[str, Any]) -> None:
    """`vision_feature_layer(s)` index the vision tower's hidden states (layers + 1 of them): keep them valid."""
    vision = d.get("vision_config")
    n = vision.get("num_hidden_layers") if isinstance(vision, dict) else None
    if not is_int(n):
        return

    def clamp(x: int) -> int:
        return max(x, -(n + 1)) if x < 0 else min(x, n)

    for key in ("vision_feature_layer", "vision_feature_layers"):
        v = d.get(key)
        if is_int(v):
            d[key] = clamp(v)
        elif isinstance(v, list) and v and all(is_int(x) for x in v):
            d[key] = [clamp(x) for x in v]


def fix_grid_pinpoints(d: dict[str, Any]) -> None:
    """LLaVA-NeXT-style "any resolution" grids are multiples of the vision tower's image size: rescale them to
    the shrunk size and keep the grids of at most 2 tiles (each tile is one more pass of the vision tower)."""
    grid, vision = d.get("image_grid_pinpoints"), d.get("vision_config")
    size = vision.get("image_size") if isinstance(vision, dict) else None
    if not (isinstance(grid, list) and grid and is_int(size)
            and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(is_int(x) and x > 0 for x in p) for p in grid)):
        return
    unit = math.gcd(*[x for p in grid for x in p])
    small = [[h // unit * size, w // unit * size] for h, w in grid if (h // unit) * (w // unit) <= 2]
    d["image_grid_pinpoints"] = small or [[size, size]]


def fix_heads(d: dict[str, Any], old: dict[str, Any]) -> None:
    hidden = next((d[k] for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if is_int(d.get(k))), None)
    heads_key = next((k for k in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads")
                      if is_int(d.get(k))), None)
    if hidden and heads_key:
        heads = d[heads_key]
        while heads > 1 and hidden % heads:
            heads -= 1
        d[heads_key] = heads
        for k in ("decoder_attention_heads",):
            if is_int(d.get(k)):
                d[k] = heads
        old_hidden = next((old[k] for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if is_int(old.get(k))), 0)
        if is_int(d.get("d_head")) and is_int(old.get("d_head")) and old["d_head"] * old[heads_key] == old_hidden:
            d["d_head"] = hidden // heads
        if all(is_int(d.get(k)) and is_int(old.get(k)) for k in ("coordinate_size", "shape_size")) and \
                4 * old["coordinate_size"] + 2 * old["shape_size"] == old_hidden:
            # LayoutLMv3 concatenates x0, y0, x1, y1 and h, w embeddings into one hidden vector
            d["coordinate_size"] = hidden // 6
            d["shape_size"] = (hidden - 4 * d["coordinate_size"]) // 2
        if "head_dim" in d and d["head_dim"] is None:
            d["head_dim"] = hidden // heads  # some classes leave it None and never derive it
        # A head_dim that was hidden/heads must stay so (many attention impls assume it).
        if is_int(d.get("head_dim")) and is_int(old.get("head_dim")) and old[heads_key] and \
                old["head_dim"] * old[heads_key] == old_hidden:
            d["head_dim"] = hidden // heads
        if "num_key_value_heads" in d and d["num_key_value_heads"] is None:
            d["num_key_value_heads"] = heads  # left None and never derived by some classes
        for kv_key in ("num_key_value_heads", "n_kv_heads", "num_kv_heads"):
            if is_int(d.get(kv_key)):
                # multi-head (not grouped) attention stays so: MLA and others assume kv heads == heads
                kv = heads if old.get(kv_key) == old[heads_key] else min(d[kv_key], heads)
                while kv > 1 and heads % kv:
                    kv -= 1
                d[kv_key] = kv
        for k, v in list(d.items()):
            # per-layer head counts (num_key_value_heads_per_layer...) must divide the shrunk head count
            if "heads" in k and isinstance(v, list) and v and all(is_int(x) and x > 0 for x in v):
                out = []
                for x in v:
                    x = min(x, heads)
                    while x > 1 and heads % x:
                        x -= 1
                    out.append(x)
                d[k] = out
    for kv_key in [k for k in d if R_KV_HEADS.match(k) and k.startswith(("encoder_", "decoder_"))]:
        # encoder/decoder pairs: multi-head attention (kv heads == heads) stays so (Moonshine assumes it)
        heads_of = kv_key.replace("key_value_heads", "attention_heads")
        if is_int(d[kv_key]) and is_int(d.get(heads_of)) and old.get(kv_key) == old.get(heads_of):
            d[kv_key] = d[heads_of]
    _fix_mrope(d)
    if all(is_int(d.get(k)) and is_int(old.get(k)) for k in ("num_heads", "head_dim", "expand")) and hidden and \
            old["num_heads"] * old["head_dim"] == old["expand"] * old_hidden_of(old):
        d["head_dim"] = max(1, d["expand"] * hidden // d["num_heads"])  # Mamba-2: heads tile expand * hidden
    for groups_key, heads_of in (("n_groups", "num_heads"), ("mamba_n_groups", "mamba_n_heads"),
                                 ("n_groups", "mamba_num_heads")):
        if is_int(d.get(groups_key)) and is_int(d.get(heads_of)):
            g = min(d[groups_key], d[heads_of])  # SSM groups must divide the SSM heads
            while g > 1 and d[heads_of] % g:
                g -= 1
            d[groups_key] = g
    for n_heads, d_head, expand in (("mamba_n_heads", "mamba_d_head", "mamba_expand"),
                                    ("n_mamba_heads", "mamba_headdim", "mamba_expand")):
        if all(is_int(d.get(k)) and is_int(old.get(k)) for k in (n_heads, d_head, expand)) and hidden and \
                old[n_heads] * old[d_head] == old[expand] * old_hidden_of(old):
            # Mamba-2 heads must tile the expanded inner size
            d[d_head] = max(1, d[expand] * hidden // d[n_heads])
    if is_int(d.get("pooler_output_size")) and hidden and old["pooler_output_size"] == old_hidden_of(old):
        d["pooler_output_size"] = hidden  # ViT's pooler keeps the width that dual encoders project from
    if is_int(d.get("attention_hidden_size")) and hidden and old_hidden_of(old) and \
            old["attention_hidden_size"] % old_hidden_of(old) == 0:
        # Zamba's shared attention reads [hidden, embeddings] concatenated: a multiple of hidden
        d["attention_hidden_size"] = hidden * (old["attention_hidden_size"] // old_hidden_of(old))
        if heads_key and is_int(d.get("attention_head_dim")) and is_int(old.get(heads_key)) and \
                old.get("attention_head_dim", 0) * old[heads_key] == old["attention_hidden_size"]:
            d["attention_head_dim"] = d["attention_hidden_size"] // d[heads_key]
    if all(is_int(d.get(k)) for k in ("qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim")) and \
            old["qk_head_dim"] == old["qk_nope_head_dim"] + old["qk_rope_head_dim"]:
        d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        if is_int(d.get("head_dim")) and old.get("head_dim") == old["qk_head_dim"]:
            d["head_dim"] = d["qk_head_dim"]  # the rotary part is head_dim * partial_rotary_factor
    # top-k experts never above the number of experts
    experts = next((d[k] for k in d if R_EXPERTS.match(k) and is_int(d[k])), None)
    if experts:
        for k in list(d):
            if R_TOP_K.match(k) and is_int(d[k]):
                d[k] = min(d[k], experts)
        if "num_experts_per_tok" in d and d["num_experts_per_tok"] is None:
            d["num_experts_per_tok"] = min(2, experts)  # a router needs its k


def _fix_mrope(d: dict[str, Any]) -> None:
    """Multimodal RoPE sections (t, h, w) must sum to half the (shrunk) head dim: rescale them."""
    head_dim = d.get("head_dim")
    if not is_int(head_dim):
        hidden, heads = d.get("hidden_size"), d.get("num_attention_heads")
        head_dim = hidden // heads if is_int(hidden) and is_int(heads) and heads else None
    for key in ("rope_parameters", "rope_scaling"):
        rope = d.get(key)
        if isinstance(rope, dict) and rope and "mrope_section" not in rope and head_dim and \
                _uses_mrope(d.get("model_type")):
            rope = {**rope, "mrope_section": [1, 1, 1]}  # the model's built-in default assumes a 128 head dim
        if not (isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list) and head_dim):
            continue
        sections = rope["mrope_section"]
        factor = rope.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 1.0
        target = int(head_dim * factor) // 2
        if sum(sections) == target or not sections:
            continue
        new = [max(1, x * target // sum(sections)) for x in sections] if sum(sections) > 3 else \
            [target - 2 * (target // 3), target // 3, target // 3]
        new[0] += target - sum(new)
        d[key] = {**rope, "mrope_section": new}


def _uses_mrope(model_type: str | None) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        return False
    return "mrope_section" in (getattr(cls, "ignore_keys_at_rope_validation", None) or ())


def fix_token_ids(d: dict[str, Any]) -> None:
    """Token ids outside the shrunk vocabulary move to distinct ids at its top, with one mapping for the whole
    config tree (a text_config's eos and the top-level video placeholder must not land on the same id)."""
    levels = [d] + [v for v in subconfigs(d)]
    vocabs = [lv["vocab_size"] for lv in levels if is_int(lv.get("vocab_size")) and lv["vocab_size"] >= 8]
    if not vocabs:
        return
    vocab = min(vocabs)
    taken = {v for lv in levels for k, v in lv.items() if R_TOKEN_ID.match(k) and is_int(v) and v < vocab}
    remapped: dict[int, int] = {}
    nxt = vocab - 1

    def new_id(x: int) -> int:
        nonlocal nxt
        if x < vocab:
            return x
        if x not in remapped:
            while nxt in taken:
                nxt -= 1
            taken.add(nxt)
            remapped[x] = nxt
        return remapped[x]

    for lv in levels:
        for k, v in list(lv.items()):
            if not R_TOKEN_ID.match(k):
                continue
            if is_int(v):
                lv[k] = new_id(v)
            elif isinstance(v, list) and v and all(is_int(x) for x in v):
                lv[k] = [new_id(x) for x in v]
