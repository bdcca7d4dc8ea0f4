"""Enumerate the built-in transformers entries from the library's own auto mappings.

Only the `MODEL_*_MAPPING_NAMES` dicts (plain strings) are read, so listing ~1,600 entries takes no model
import. A (model_type, class) pair can sit in several mappings (a base model is also a backbone, a VLM is in
both IMAGE_TEXT_TO_TEXT and MULTIMODAL_LM); the most specific task wins, by the order of TASK_OF_MAPPING."""

from __future__ import annotations

from functools import lru_cache

from harness.zoo.entry import ZooEntry

# Mapping name (between MODEL_FOR_ and _MAPPING_NAMES) -> task family, most specific first.
TASK_OF_MAPPING: list[tuple[str, str]] = [
    ("CAUSAL_LM", "causal-lm"),
    ("MASKED_LM", "masked-lm"),
    ("SEQ_TO_SEQ_CAUSAL_LM", "seq2seq-lm"),
    ("SPEECH_SEQ_2_SEQ", "speech-seq2seq"),
    ("CTC", "ctc"),
    ("RNNT", "ctc"),
    ("TDT", "ctc"),
    ("SEQUENCE_CLASSIFICATION", "sequence-classification"),
    ("TOKEN_CLASSIFICATION", "token-classification"),
    ("QUESTION_ANSWERING", "question-answering"),
    ("TABLE_QUESTION_ANSWERING", "question-answering"),
    ("DOCUMENT_QUESTION_ANSWERING", "question-answering"),
    ("MULTIPLE_CHOICE", "multiple-choice"),
    ("NEXT_SENTENCE_PREDICTION", "next-sentence-prediction"),
    ("IMAGE_TEXT_TO_TEXT", "multimodal"),
    ("MULTIMODAL_LM", "multimodal"),
    ("VISUAL_QUESTION_ANSWERING", "multimodal"),
    ("RETRIEVAL", "multimodal"),
    ("TEXT_RECOGNITION", "multimodal"),
    ("TABLE_RECOGNITION", "multimodal"),
    ("ZERO_SHOT_IMAGE_CLASSIFICATION", "zero-shot-image-classification"),
    ("ZERO_SHOT_OBJECT_DETECTION", "object-detection"),
    ("IMAGE_CLASSIFICATION", "image-classification"),
    ("VIDEO_CLASSIFICATION", "video-classification"),
    ("OBJECT_DETECTION", "object-detection"),
    ("SEMANTIC_SEGMENTATION", "image-segmentation"),
    ("INSTANCE_SEGMENTATION", "image-segmentation"),
    ("UNIVERSAL_SEGMENTATION", "image-segmentation"),
    ("IMAGE_SEGMENTATION", "image-segmentation"),
    ("MASK_GENERATION", "image-segmentation"),
    ("DEPTH_ESTIMATION", "depth-estimation"),
    ("NORMAL_ESTIMATION", "depth-estimation"),
    ("POINTMAP_ESTIMATION", "depth-estimation"),
    ("KEYPOINT_DETECTION", "keypoint-detection"),
    ("KEYPOINT_MATCHING", "keypoint-detection"),
    ("POSE_ESTIMATION", "keypoint-detection"),
    ("IMAGE_TO_IMAGE", "image-to-image"),
    ("IMAGE_MATTING", "image-to-image"),
    ("MASKED_IMAGE_MODELING", "masked-image-modeling"),
    ("CAUSAL_IMAGE_MODELING", "masked-image-modeling"),
    ("AUDIO_CLASSIFICATION", "audio-classification"),
    ("AUDIO_FRAME_CLASSIFICATION", "audio-classification"),
    ("AUDIO_XVECTOR", "audio-classification"),
    ("TEXT_TO_SPECTROGRAM", "text-to-audio"),
    ("TEXT_TO_WAVEFORM", "text-to-audio"),
    ("TIME_SERIES_CLASSIFICATION", "time-series"),
    ("TIME_SERIES_PREDICTION", "time-series"),
    ("TIME_SERIES_REGRESSION", "time-series"),
    ("DECISION", "reinforcement-learning"),
    ("PRETRAINING", "pretraining"),
    ("BACKBONE", "backbone"),
    ("IMAGE", "image-feature-extraction"),
    ("TEXT_ENCODING", "feature-extraction"),
    ("", "feature-extraction"),  # MODEL_MAPPING_NAMES: the bare base models
]


def _mapping_attr(key: str) -> str:
    return "MODEL_MAPPING_NAMES" if not key else f"MODEL_FOR_{key}_MAPPING_NAMES"


@lru_cache(maxsize=1)
def transformers_pairs() -> tuple[tuple[str, str, str], ...]:
    """Every (model_type, class name, task family) in transformers' auto mappings, sorted."""
    from transformers.models.auto import modeling_auto

    known = {_mapping_attr(k) for k, _ in TASK_OF_MAPPING}
    extra = sorted(
        n for n in dir(modeling_auto) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES") and n not in known
    )
    order = [(_mapping_attr(k), t) for k, t in TASK_OF_MAPPING] + [(n, "other") for n in extra]
    task_of: dict[tuple[str, str], str] = {}
    for attr, task in order:
        for model_type, classes in getattr(modeling_auto, attr, {}).items():
            for cls in classes if isinstance(classes, (list, tuple)) else [classes]:
                task_of.setdefault((model_type, cls), task)  # first (most specific) mapping wins
    return tuple(sorted((mt, cls, task) for (mt, cls), task in task_of.items()))


def transformers_entries() -> list[ZooEntry]:
    return [
        ZooEntry(id=f"transformers/{mt}/{cls}", library="transformers", model_type=mt, model_class=cls, task=task)
        for mt, cls, task in transformers_pairs()
    ]
