"""`load_zoo` and `select`: which entries a run covers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from harness.zoo.entry import ZooEntry
from harness.zoo.smoke import SMOKE_IDS


def full_zoo() -> list[ZooEntry]:
    from harness.zoo.registry import transformers_entries

    return transformers_entries() + diffusers_entries()


def diffusers_entries() -> list[ZooEntry]:
    """Every diffusers model spec (diffusers_zoo.py) and pipeline spec (pipelines.py), as entries."""
    from harness.zoo.diffusers_zoo import MODEL_SPECS
    from harness.zoo.pipelines import PIPELINE_SPECS

    entries = [ZooEntry(id=f"diffusers/{s.name}", library="diffusers", model_type=s.name, model_class=s.cls, task=s.task)
               for s in MODEL_SPECS]
    entries += [ZooEntry(id=f"diffusers/pipeline/{p.name}", library="diffusers", model_type=p.name,
                         model_class=p.cls, task="pipeline") for p in PIPELINE_SPECS]
    return entries


def load_zoo(spec: str = "smoke", *, hub_layers: int = 2) -> list[ZooEntry]:
    """The entries of `spec`: "smoke" (a fixed ~50-entry subset covering every task family of both
    libraries), "full" (every built-in entry) or the path of a models-list CSV (hub entries, resolved
    through the local Hugging Face cache). Raises ValueError for anything else or a malformed CSV."""
    if spec == "full":
        return full_zoo()
    if spec == "smoke":
        by_id = {e.id: e for e in full_zoo()}
        missing = [i for i in SMOKE_IDS if i not in by_id]
        if missing:  # a library upgrade renamed something: fail loudly rather than shrink the smoke set
            raise ValueError(f"smoke zoo ids not in the full zoo: {missing}")
        return [by_id[i] for i in SMOKE_IDS]
    if spec.endswith(".csv") or os.path.sep in spec:
        if not os.path.isfile(spec):
            raise ValueError(f"zoo spec {spec!r}: no such models-list CSV file")
        from harness.zoo.hub import load_models_csv

        return load_models_csv(spec, hub_layers=hub_layers)
    raise ValueError(f"unknown zoo spec {spec!r}: expected 'smoke', 'full' or the path of a models-list .csv")


def select(entries: Iterable[ZooEntry], library: str | None = None, task: str | None = None,
           match: str | None = None) -> list[ZooEntry]:
    """Entries of `library` and `task` (exact) whose id matches the regex `match` (re.search).
    An invalid regex raises ValueError."""
    pattern = None
    if match:
        try:
            pattern = re.compile(match)
        except re.error as exc:
            raise ValueError(f"invalid --match regex {match!r}: {exc}") from exc
    return [e for e in entries if (library is None or e.library == library) and (task is None or e.task == task)
            and (pattern is None or pattern.search(e.id))]
