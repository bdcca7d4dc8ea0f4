"""Build a built-in transformers entry: tiny config -> random-weight model -> inputs."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.zoo import budget, overrides
from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry
from harness.zoo.inputs import build_inputs, fit_placeholders, fit_waveform, placeholder_id
from harness.zoo.shrink import Size, shrink_dict


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        elif v is overrides.DELETE:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def tiny_config(model_type: str, size: Size = Size()) -> Any:
    """The config class's defaults of `model_type`, shrunk, with the family's overrides applied."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError as exc:
        raise ZooBuildError(f"no config class for model_type {model_type!r}", category="config_error",
                            stage="config") from exc
    rule = overrides.rule_for(model_type)
    try:
        base = cls(**rule.base) if rule.base else cls()
        d = shrink_dict(base.to_dict(), size, model_type)
        d.pop("model_type", None)
        d = _deep_merge(d, rule.config)
        config = cls(**d)
        if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
            # heads that build decoder inputs by shifting (classification, QA) need a start token
            config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
        for k, v in rule.after.items():  # values the constructor would overwrite
            setattr(config, k, v)
        return config
    except ZooBuildError:
        raise
    except Exception as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="config_error", stage="config") from exc


def model_class(name: str) -> type:
    import transformers

    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError) as exc:
        # transformers raises ImportError naming the missing backend for dummy objects
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="missing_dependency", stage="init") from exc


def instantiate(cls: type, config: Any, seed: int, max_params: int = budget.DEFAULT_BUDGET) -> tuple[torch.nn.Module, int]:
    """`cls` with random weights from `config`: checked against the budget on meta first, seeded, float32, eval."""
    n = budget.check_budget(lambda: cls._from_config(config), max_params)
    torch.manual_seed(seed)
    try:
        model = cls._from_config(config, dtype=torch.float32)
    except ZooBuildError:
        raise
    except Exception as exc:
        category = "missing_dependency" if isinstance(exc, ImportError) else "init_error"
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category=category, stage="init") from exc
    if n is None:
        n = budget.enforce(model, max_params)
    return model.eval(), n


def finish(entry: ZooEntry, model: torch.nn.Module, config: Any, seed: int, n: int) -> BuiltEntry:
    rule = overrides.rule_for(entry.model_type)
    try:
        inputs = build_inputs(model, config, entry.model_class, seed)
        if rule.inputs is not None:  # before the probes, which need inputs the model accepts
            inputs = rule.inputs(model, config, inputs, seed)
        placeholders = any(placeholder_id(config, kind) is not None for kind in ("image", "video", "audio"))
        for _ in range(2):  # a multimodal model reports a waveform problem only once its images fit
            before = inputs
            inputs = fit_waveform(model, inputs)
            if placeholders:
                inputs = fit_placeholders(model, config, inputs)
            if inputs is before:
                break
    except ZooBuildError:
        raise
    except Exception as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="missing_input", stage="inputs") from exc
    if entry.task in DENSE_BEFORE_THRESHOLD and "output_hidden_states" in _forward_params(model):
        # detections depend on thresholded scores (float32 noise flips some): the dense maps they are
        # computed from are compared too (harness/sweep/numerics.py, data-dependent outputs)
        inputs = {**inputs, "output_hidden_states": True}
    return BuiltEntry(model=model, inputs=inputs, entry=entry, num_parameters=n)


DENSE_BEFORE_THRESHOLD = ("keypoint-detection",)


def _forward_params(model: torch.nn.Module) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def config_for_class(cls: type, config: Any) -> Any:
    """The config `cls` takes, from the tiny config of its model_type. Some classes listed under a model_type
    take another config class: a sub-config of it (a decoder-only or text-only head of a composite model),
    or a wrapper whose only sub-config, `text_config`, is any model's config (a head on top of a whole model).
    Otherwise the model_type's own config is kept (some families reuse another's classes with a compatible
    config)."""
    from transformers import PreTrainedConfig

    wanted = getattr(cls, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    seen, todo = set(), [config]
    while todo:  # breadth first: the outermost matching sub-config
        c = todo.pop(0)
        if id(c) in seen:
            continue
        seen.add(id(c))
        if isinstance(c, wanted):
            return c
        todo += [v for v in vars(c).values() if isinstance(v, PreTrainedConfig)]
    from transformers import AutoConfig

    if getattr(wanted, "sub_configs", None) != {"text_config": AutoConfig}:
        return config  # not a wrapper of any one model (composite configs of other families are duck-typed)
    fields = {f.name for f in dataclasses.fields(wanted)} if dataclasses.is_dataclass(wanted) else set()
    extra: dict[str, Any] = {}
    hidden = getattr(text_config_of(config), "hidden_size", None)
    if "hidden_size" in fields and hidden:
        extra["hidden_size"] = hidden  # the head reads the wrapped model's hidden states
    try:
        return wanted(text_config=config.to_dict(), **extra)
    except Exception as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="config_error", stage="config") from exc


def text_config_of(config: Any) -> Any:
    try:
        return config.get_text_config()
    except Exception:  # some composite configs' get_text_config is strict about their layout
        return config


def build(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    cls = model_class(entry.model_class)
    config = config_for_class(cls, tiny_config(entry.model_type))
    if entry.model_class.endswith("ForCTC") and getattr(config, "vocab_size", None) is None:
        config.vocab_size = 32  # CTC heads need an output alphabet; base configs leave it to the tokenizer
    model, n = instantiate(cls, config, seed)
    return finish(entry, model, model.config, seed, n)
