"""Dispatch `ZooEntry.build` to the builder of the entry's library, then apply the zoo-wide rules every
built model gets (harness.zoo.zero_init: zero-initialised weights made small and random;
harness.zoo.norm_calibration: batch norms that leave the outputs dead re-seeded and calibrated)."""

from __future__ import annotations

import torch

from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry
from harness.zoo.norm_calibration import keep_alive
from harness.zoo.zero_init import reinit_zero_weights


def build_entry(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    if not entry.available:
        raise ZooBuildError(entry.reason or "not available", category="not_available", stage="resolve")
    if entry.library == "transformers":
        from harness.zoo import transformers_zoo

        built = transformers_zoo.build(entry, seed)
    elif entry.library == "diffusers" and entry.task == "pipeline":
        from harness.zoo import pipelines

        built = pipelines.build_pipeline(entry, seed)
    elif entry.library == "diffusers":
        from harness.zoo import diffusers_zoo

        built = diffusers_zoo.build(entry, seed)
    elif entry.library == "hub":
        from harness.zoo import hub

        built = hub.build(entry, seed)
    else:
        raise ValueError(f"unknown library {entry.library!r} for {entry.id}")
    built = informative_weights(built, seed)
    keep_alive(built, seed)
    return built


def informative_weights(built: BuiltEntry, seed: int = 0) -> BuiltEntry:
    """The zero-init rule on the model, or on each module of a pipeline; the names changed go in notes."""
    model = built.model
    modules = {"": model} if isinstance(model, torch.nn.Module) else {
        k: v for k, v in (getattr(model, "components", None) or {}).items() if isinstance(v, torch.nn.Module)}
    changed = []
    for prefix, m in modules.items():
        changed += [f"{prefix}.{n}" if prefix else n for n in reinit_zero_weights(m, seed)]
    if changed:
        built.notes["reinitialised"] = changed
    return built
