"""The causes table (harness/ci/causes.yaml, harness/ci/causes.py): every row that proves nothing about the
backend is listed in coverage.md with a cause; a row nothing explains shows as `unattributed`; and the
accepted full zoo has no such row, and the table no entry that explains nothing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.ci import causes
from harness.ci.coverage import coverage_markdown

ROOT = Path(__file__).resolve().parents[3]
ACCEPTED = ROOT / "reports/full/accepted/results.csv"


def _df(rows: list[dict]) -> pd.DataFrame:
    base = {"library": "transformers", "task": "x", "dtype": "float32", "precision": "highest", "phase": "inference",
            "error_type": "", "error_message": "", "uninformative": "", "cause": "", "control_error": "",
            "failing_op": "", "max_abs_err": None, "max_rel_err": None, "cosine": None, "rmse_ratio": None}
    return pd.DataFrame([{**base, **r} for r in rows])


TABLE = causes.parse_causes({"causes": [
    {"match": "t/ties/*", "kind": "fail_accuracy", "cause": "upstream", "reason": "exact ties in a top-k"},
    {"match": "*", "kind": "uninformative", "when": "^rounding-dominated", "cause": "upstream",
     "reason": "the baseline's own rounding"},
    {"match": "t/mem/M", "modes": ["compiled"], "kind": "oom", "cause": "environment", "reason": "the cap"},
]})

ROWS = [
    {"entry_id": "t/ties/A", "mode": "eager", "status": "fail_accuracy", "error_message": "17 of 32 rows"},
    {"entry_id": "t/new/B", "mode": "eager", "status": "fail_accuracy", "error_message": "wrong"},
    {"entry_id": "t/ctl/C", "mode": "compiled", "status": "fail_accuracy", "cause": "upstream",
     "control_error": "aot_eager on CPU fails the rule too: logits"},
    {"entry_id": "t/rd/D", "mode": "eager", "status": "pass", "uninformative": "rounding-dominated: 2.5 x scale"},
    {"entry_id": "t/zero/E", "mode": "eager", "status": "pass", "uninformative": "all zeros: logits"},
    {"entry_id": "t/mem/M", "mode": "compiled", "status": "oom"},
    {"entry_id": "t/mem/M", "mode": "eager", "status": "pass"},
    {"entry_id": "t/ok/F", "mode": "eager", "status": "pass"},
]


def test_explain_attributes_from_the_table_then_the_control_else_unattributed() -> None:
    t = causes.explain(_df(ROWS), TABLE).set_index(["entry_id", "mode"])
    assert len(t) == 6  # the two plain passes prove something: not listed
    assert t.loc[("t/ties/A", "eager"), "cause"] == "upstream"
    assert t.loc[("t/ties/A", "eager"), "reason"] == "exact ties in a top-k"
    assert t.loc[("t/ctl/C", "compiled"), "cause"] == "upstream"  # no entry: the control's attribution
    assert "fails the rule too" in t.loc[("t/ctl/C", "compiled"), "reason"]
    assert t.loc[("t/rd/D", "eager"), "kind"] == "uninformative"
    assert t.loc[("t/rd/D", "eager"), "cause"] == "upstream"  # matched by its evidence, not its name
    assert t.loc[("t/zero/E", "eager"), "cause"] == causes.UNATTRIBUTED  # `when` does not fit "all zeros"
    assert t.loc[("t/new/B", "eager"), "cause"] == causes.UNATTRIBUTED
    assert t.loc[("t/mem/M", "compiled"), "cause"] == "environment"


def test_modes_restrict_an_entry() -> None:
    rows = [{"entry_id": "t/mem/M", "mode": "eager", "status": "oom"}]
    assert causes.explain(_df(rows), TABLE)["cause"].tolist() == [causes.UNATTRIBUTED]


def test_unused_entries_are_reported() -> None:
    df = _df([r for r in ROWS if r["entry_id"] != "t/mem/M"])
    assert [c.match for c in causes.unused(df, TABLE)] == ["t/mem/M"]


def test_coverage_lists_every_row_with_its_cause() -> None:
    md = coverage_markdown(_df(ROWS))
    section = md.split("## Causes of the rows that prove nothing", 1)[1]
    for entry in ("t/ties/A", "t/new/B", "t/ctl/C", "t/rd/D", "t/zero/E", "t/mem/M"):
        assert f"`{entry}`" in section
    assert "`t/ok/F`" not in section
    assert "### Accuracy failures (3:" in section


@pytest.mark.parametrize("bad, message", [
    ({"match": "a", "kind": "fail_accuracy", "cause": "gremlins", "reason": "r"}, "cause 'gremlins'"),
    ({"match": "a", "kind": "slow", "cause": "backend", "reason": "r"}, "kind 'slow'"),
    ({"match": "a", "kind": "oom", "cause": "backend"}, "`reason` is required"),
    ({"match": "a", "kind": "oom", "cause": "backend", "reason": "r", "mode": "eager"}, "unknown keys"),
    ({"match": "a", "kind": "oom", "cause": "backend", "reason": "r", "modes": ["gpu"]}, "modes"),
    ({"match": "a", "kind": "oom", "cause": "backend", "reason": "r", "when": "("}, "not a regex"),
])
def test_malformed_table_is_refused(bad: dict, message: str) -> None:
    with pytest.raises(causes.CausesError, match=message):
        causes.parse_causes({"causes": [bad]})


def test_the_shipped_table_loads() -> None:
    assert causes.load_causes()  # harness/ci/causes.yaml parses and is not empty


def test_accepted_full_zoo_has_a_cause_for_every_row_and_no_stale_entry() -> None:
    """The accepted full zoo (reports/full/accepted): every fail_accuracy, uninformative and run-failure row has
    a cause (from the table or its control), and every table entry still explains some row (an entry whose row
    now passes must go, as the finding it records no longer holds)."""
    from harness.sweep.results import read_csv

    df = read_csv(ACCEPTED)
    t = causes.explain(df)
    missing = t[t["cause"] == causes.UNATTRIBUTED]
    assert missing.empty, missing[["entry_id", "mode", "kind", "evidence"]].to_string()
    assert [c.match for c in causes.unused(df, causes.load_causes())] == []
