"""Joining shard outputs: the union of their rows, each (entry_id, phase, mode) exactly once."""

from __future__ import annotations

import json
from pathlib import Path

from harness.schema import KEY, PHASES, VOLATILE
from harness.sweep import outputs
from harness.sweep.results import ResultStore, load_run_rows, to_frame, utc_now


class MergeError(ValueError):
    pass


def merge_frames(frames: list, names: list[str], later_wins: bool = False):
    """The union of the frames' rows. An (entry_id, phase, mode) in several frames must have the same result in
    each (shards that overlap; measurements, schema.MEASUREMENTS, may differ), unless `later_wins`: then the row of the last frame holding it is kept (a partial
    re-run given after the sweep it corrects)."""
    import pandas as pd

    if not frames:
        raise MergeError("nothing to merge")
    tagged = []
    for df, name in zip(frames, names, strict=True):
        d = df.copy()
        d["_source"] = name
        tagged.append(d)
    all_rows = pd.concat(tagged, ignore_index=True)
    if later_wins:
        all_rows = all_rows.drop_duplicates(list(KEY), keep="last")
    dup = all_rows[all_rows.duplicated(list(KEY), keep=False)]
    if not dup.empty:
        stable = [c for c in all_rows.columns if c not in VOLATILE and c != "_source"]
        distinct = dup.drop_duplicates(stable)
        conflicts = distinct[distinct.duplicated(list(KEY), keep=False)]
        if len(conflicts):
            key = tuple(conflicts.iloc[0][list(KEY)])
            srcs = sorted(set(dup[(dup[list(KEY)] == key).all(axis=1)]["_source"]))
            raise MergeError(f"({', '.join(map(str, key))}) has different results in {', '.join(srcs)}")
        all_rows = all_rows.drop_duplicates(list(KEY), keep="first")
    return to_frame(all_rows.drop(columns="_source").to_dict("records"))


def merge_runs(run_dirs: list[str | Path], out: str | Path, later_wins: bool = False) -> tuple[object, dict]:
    frames, names, metas = [], [], []
    for d in run_dirs:
        d = Path(d)
        try:
            frames.append(load_run_rows(d))
        except (FileNotFoundError, ValueError) as exc:
            raise MergeError(str(exc)) from None
        names.append(str(d))
        metas.append(ResultStore(d).read_run() or {})
    df = merge_frames(frames, names, later_wins)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = outputs.write_reports(df, out, title=f"merge of {len(run_dirs)} runs")
    shards = sorted(tuple(m.get("selection", {}).get("shard", [1, 1])) for m in metas)
    meta = {"run_id": out.name, "merged_from": [str(d) for d in run_dirs], "shards": shards, "finished": utc_now(),
            "later_wins": later_wins,
            "selection": _merged_selection(metas),
            "headline": {k: v for k, v in outputs.headline(df).items() if k not in ("statuses", "excluded")}}
    n = {s[1] for s in shards}
    if len(n) == 1 and sorted(s[0] for s in shards) != list(range(1, n.pop() + 1)):
        meta["warning"] = f"shards {shards} do not cover 1..N exactly"
    (out / "run.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return df, paths


def _merged_selection(metas: list[dict]) -> dict:
    """The first run's selection without its shard, with the phases of every run (an inference run merged with
    a train run selected both: `hf-tpu compare` owes the rows of each)."""
    sel = {k: v for k, v in (metas[0].get("selection") or {}).items() if k != "shard"}
    phases = {p for m in metas for p in ((m.get("selection") or {}).get("phases") or [])}
    if phases:
        sel["phases"] = [p for p in PHASES if p in phases] + sorted(phases - set(PHASES))
    return sel
