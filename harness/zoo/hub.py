"""Hub models lists: a CSV of model ids (a Hub export's shape) resolved through the local Hugging Face cache,
offline. A cached config.json gives the real architecture with random weights and its depth capped
(`hub_layers`, 2 by default); an id whose config is not cached becomes a not-available entry with the reason."""

from __future__ import annotations

import csv
import json
import os
from typing import Any

from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry
from harness.zoo.shrink import cap_layers

# Real architectures are big even at 2 layers (a 7B model keeps its 4096-wide embeddings): a separate,
# larger budget that still stops a sweep from allocating tens of GB by accident.
HUB_BUDGET = 1_000_000_000

# Hub pipeline_tag -> task family (the families of the built-in zoo).
TASK_OF_PIPELINE_TAG = {
    "text-generation": "causal-lm", "fill-mask": "masked-lm", "text2text-generation": "seq2seq-lm",
    "translation": "seq2seq-lm", "summarization": "seq2seq-lm", "text-classification": "sequence-classification",
    "zero-shot-classification": "sequence-classification", "token-classification": "token-classification",
    "question-answering": "question-answering", "table-question-answering": "question-answering",
    "multiple-choice": "multiple-choice", "feature-extraction": "feature-extraction",
    "sentence-similarity": "feature-extraction", "image-classification": "image-classification",
    "image-feature-extraction": "image-feature-extraction", "object-detection": "object-detection",
    "zero-shot-object-detection": "object-detection", "image-segmentation": "image-segmentation",
    "mask-generation": "image-segmentation", "depth-estimation": "depth-estimation",
    "zero-shot-image-classification": "zero-shot-image-classification", "video-classification": "video-classification",
    "audio-classification": "audio-classification", "automatic-speech-recognition": "speech-seq2seq",
    "text-to-speech": "text-to-audio", "text-to-audio": "text-to-audio", "image-text-to-text": "multimodal",
    "visual-question-answering": "multimodal", "image-to-text": "multimodal", "document-question-answering": "multimodal",
    "time-series-forecasting": "time-series", "image-to-image": "image-to-image",
}


def cache_dir() -> str:
    """The hub cache in effect now (huggingface_hub reads HF_HUB_CACHE only at import; tests set it later)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def cached_file(model_id: str, filename: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id=model_id, filename=filename, cache_dir=cache_dir())
    except Exception:  # an id that is not a valid repo name
        return None
    return path if isinstance(path, str) else None


def _task_of_class(class_name: str) -> str | None:
    from harness.zoo.registry import transformers_pairs

    return next((task for _, cls, task in transformers_pairs() if cls == class_name), None)


def resolve(model_id: str, model_type: str = "", pipeline_tag: str = "", hub_layers: int = 2) -> ZooEntry:
    """One CSV row -> a ZooEntry (never raises: what cannot be resolved offline is not available)."""
    task = TASK_OF_PIPELINE_TAG.get(pipeline_tag, pipeline_tag or "unknown")
    base = dict(id=f"hub/{model_id}", library="hub", model_type=model_type or "unknown", model_class="", task=task,
                hub_layers=hub_layers)
    path = cached_file(model_id, "config.json")
    if path is None:
        if cached_file(model_id, "model_index.json"):
            return ZooEntry(**base, available=False, reason="diffusers pipeline repos are not built from the hub")
        return ZooEntry(**base, available=False,
                        reason=f"config.json of {model_id} is not in the local Hugging Face cache ({cache_dir()})")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        return ZooEntry(**base, available=False, reason=f"unreadable cached config.json: {exc}")
    if not isinstance(config, dict):
        return ZooEntry(**base, available=False, reason="cached config.json is not a JSON object")
    model_type = config.get("model_type") or model_type
    architectures = config.get("architectures") or []
    model_class = architectures[0] if architectures else ""
    if not pipeline_tag and model_class:
        task = _task_of_class(model_class) or "unknown"
    if not model_type:
        return ZooEntry(**{**base, "task": task}, available=False, reason="cached config.json has no model_type")
    return ZooEntry(**{**base, "task": task, "model_type": model_type, "model_class": model_class}, source=path)


def load_models_csv(path: str, hub_layers: int = 2) -> list[ZooEntry]:
    """Entries for every row of a models-list CSV (`model_id` column required; `model_type`, `pipeline_tag`
    optional). Duplicate ids keep their first row. Raises ValueError for a malformed file."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"models list {path}: cannot read it as CSV ({exc})") from exc
    if "model_id" not in columns:
        raise ValueError(f"models list {path}: no `model_id` column (columns: {', '.join(columns) or 'none'})")
    entries: dict[str, ZooEntry] = {}
    for line, row in enumerate(rows, start=2):
        model_id = (row.get("model_id") or "").strip()
        if not model_id:
            raise ValueError(f"models list {path}, line {line}: empty model_id")
        if f"hub/{model_id}" not in entries:
            entries[f"hub/{model_id}"] = resolve(model_id, (row.get("model_type") or "").strip(),
                                                 (row.get("pipeline_tag") or "").strip(), hub_layers)
    return list(entries.values())


def real_config(entry: ZooEntry) -> Any:
    """The cached config with its depth capped at `entry.hub_layers` (sub-configs too)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(os.path.dirname(entry.source), local_files_only=True)
        d = cap_layers(config.to_dict(), entry.hub_layers)
        d.pop("model_type", None)
        return type(config)(**d)
    except Exception as exc:
        raise ZooBuildError(f"{type(exc).__name__}: {exc}", category="config_error", stage="config") from exc


def build(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    from harness.zoo.transformers_zoo import finish, instantiate, model_class

    config = real_config(entry)
    if entry.model_class:
        cls = model_class(entry.model_class)
    else:
        from transformers import AutoModel

        cls = AutoModel._model_mapping[type(config)]
    model, n = instantiate(cls, config, seed, max_params=HUB_BUDGET)
    return finish(entry, model, model.config, seed, n)

