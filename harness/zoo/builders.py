"""Dispatch `ZooEntry.build` to the builder of the entry's library."""

from __future__ import annotations

from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry


def build_entry(entry: ZooEntry, seed: int = 0) -> BuiltEntry:
    if not entry.available:
        raise ZooBuildError(entry.reason or "not available", category="not_available", stage="resolve")
    if entry.library == "transformers":
        from harness.zoo import transformers_zoo

        return transformers_zoo.build(entry, seed)
    if entry.library == "diffusers":
        from harness.zoo import diffusers_zoo

        return diffusers_zoo.build(entry, seed)
    if entry.library == "hub":
        from harness.zoo import hub

        return hub.build(entry, seed)
    raise ValueError(f"unknown library {entry.library!r} for {entry.id}")
