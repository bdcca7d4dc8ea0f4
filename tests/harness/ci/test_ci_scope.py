"""`hf-tpu compare` holds a run only to the entries its selection covers (harness.ci.scope): a shard, the
smoke zoo or a --match is compared with those expected entries, and an owed entry with no row is MISSING."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.ci.sample import row, write_run
from harness.ci.scope import run_scope
from harness.cli import main
from harness.sweep.entries import load_entries
from harness.sweep.options import SweepOptions

ALL = [e.id for e in load_entries(SweepOptions(zoo="test"))]
SHARD_1 = [e.id for e in load_entries(SweepOptions(zoo="test", shard=(1, 2)))]


def _write(tmp: Path, name: str, ids: list[str], meta: dict | None) -> Path:
    run = write_run(tmp / name, [row(i, mode=m) for i in ids for m in ("eager", "compiled")])
    if meta is not None:
        (run / "run.json").write_text(json.dumps(meta))
    return run


def _selection(**kw: object) -> dict:
    return {"selection": {**SweepOptions(zoo="test").selection(), **kw}}


def _classes(run: Path) -> pd.Series:
    return pd.read_csv(run / "comparison.csv", dtype=str, keep_default_na=False)["class"].value_counts()


@pytest.fixture
def expected(tmp_path: Path) -> Path:
    exp = tmp_path / "expected"
    assert main(["accept", str(_write(tmp_path, "base", ALL, None)), "--expected", str(exp)]) == 0
    return exp


def test_a_shard_is_compared_with_its_own_entries_only(tmp_path: Path, expected: Path) -> None:
    assert 0 < len(SHARD_1) < len(ALL)
    run = _write(tmp_path, "shard", SHARD_1, _selection(shard=[1, 2]))
    assert main(["compare", str(run), "--expected", str(expected)]) == 0
    assert dict(_classes(run)) == {"PASS": 2 * len(SHARD_1)}
    # the same rows held to the whole zoo: every other entry is MISSING
    assert main(["compare", str(run), "--expected", str(expected), "--whole-zoo"]) == 1
    assert _classes(run)["MISSING"] == 2 * (len(ALL) - len(SHARD_1))


def test_an_owed_entry_without_a_row_is_still_missing(tmp_path: Path, expected: Path) -> None:
    run = _write(tmp_path, "lost", SHARD_1[1:], _selection(shard=[1, 2]))
    assert main(["compare", str(run), "--expected", str(expected)]) == 1
    df = pd.read_csv(run / "comparison.csv", dtype=str, keep_default_na=False)
    assert set(df.loc[df["class"] == "MISSING", "entry_id"]) == {SHARD_1[0]}


def test_a_match_selects_the_scope(tmp_path: Path, expected: Path) -> None:
    run = _write(tmp_path, "match", ["test/pass"], _selection(match="^test/pass$"))
    assert main(["compare", str(run), "--expected", str(expected)]) == 0


def test_a_merged_run_owes_every_shard_it_joined(tmp_path: Path) -> None:
    meta = {"merged_from": ["a", "b"], "shards": [[1, 2], [2, 2]], **_selection()}
    run = _write(tmp_path, "merged", ALL, meta)
    scope = run_scope(run)
    assert scope is not None and scope.entry_ids == frozenset(ALL)
    meta["shards"] = [[2, 2]]
    (run / "run.json").write_text(json.dumps(meta))
    assert run_scope(run).entry_ids == frozenset(ALL) - frozenset(SHARD_1)


def test_no_or_bad_run_json_compares_everything(tmp_path: Path, expected: Path) -> None:
    run = _write(tmp_path, "bare", SHARD_1, None)
    assert run_scope(run) is None
    assert main(["compare", str(run), "--expected", str(expected)]) == 1  # MISSING: no selection known
    (run / "run.json").write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert run_scope(run) is None
    (run / "run.json").write_text(json.dumps(_selection(zoo="no-such-zoo")))
    with pytest.warns(UserWarning, match="cannot list"):
        assert run_scope(run) is None
