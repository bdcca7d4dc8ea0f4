"""Which entries a run was asked to sweep, so that `hf-tpu compare` holds it only to those.

The expected results cover the whole built-in zoo. A run of one shard, of the smoke zoo or of a `--match`
would otherwise see every other accepted entry as MISSING, and CI could only pass it with
`--allow-missing`, which also hides coverage the run really lost. The sweep records its selection in
`run.json` (`hf-tpu merge` records the shards it joined); listing the zoo again with that selection gives
the entries the run owed. An entry the run owed but has no row for is still MISSING.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

RUN_META = "run.json"


@dataclass(frozen=True)
class Scope:
    """The entry ids a run selected, and how to say so."""

    entry_ids: frozenset[str]
    description: str


def _selection_label(sel: dict, shards: list[tuple[int, int]]) -> str:
    parts = [f"zoo {sel.get('zoo', 'smoke')!r}"]
    for k in ("library", "task", "match", "limit"):
        if sel.get(k) is not None:
            parts.append(f"{k} {sel[k]!r}")
    if shards != [(1, 1)]:
        parts.append("shard " + ",".join(f"{i}/{n}" for i, n in shards))
    return ", ".join(parts)


def run_scope(run_dir: str | Path) -> Scope | None:
    """The run's selected entries from its run.json, or None when they cannot be known (no run.json, no
    selection recorded, or a zoo that no longer lists): compare then holds the run to every expected entry."""
    meta_path = Path(run_dir) / RUN_META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        warnings.warn(f"{meta_path} is unreadable ({exc}): comparing with every expected entry", stacklevel=2)
        return None
    sel = meta.get("selection")
    if not isinstance(sel, dict) or "zoo" not in sel:
        return None
    if "merged_from" in meta:
        shards = [tuple(s) for s in meta.get("shards") or [(1, 1)]]
    else:
        shards = [tuple(sel.get("shard") or (1, 1))]
    from harness.sweep.entries import SelectionError, load_entries, shard
    from harness.sweep.options import SweepOptions

    fields = {k: sel.get(k) for k in ("zoo", "library", "task", "match", "limit") if sel.get(k) is not None}
    if sel.get("hub_layers") is not None:
        fields["hub_layers"] = sel["hub_layers"]
    ids: set[str] = set()
    try:
        # the zoo is listed once (with the limit applied), then cut into each shard as the sweep does
        selected = load_entries(SweepOptions(**fields))
        for i, n in shards:
            ids |= {e.id for e in shard(selected, (int(i), int(n)))}
    except (SelectionError, OSError, TypeError, ValueError) as exc:
        warnings.warn(f"cannot list the entries {meta_path} selected ({exc}): comparing with every expected "
                      f"entry", stacklevel=2)
        return None
    return Scope(entry_ids=frozenset(ids), description=_selection_label(sel, shards))


def run_phases(run_dir: str | Path) -> frozenset[str] | None:
    """The phases the run selected (run.json's `selection.phases`; a merge records the union of its runs'),
    or None when it does not say (an older run): compare then owes the default phases and those swept."""
    try:
        sel = json.loads((Path(run_dir) / RUN_META).read_text()).get("selection")
    except (OSError, ValueError):
        return None
    phases = sel.get("phases") if isinstance(sel, dict) else None
    if not isinstance(phases, list) or not phases or not all(isinstance(p, str) for p in phases):
        return None
    return frozenset(phases)
