"""Compare a run with the expected results: one class per (entry, phase, mode).

A status is *measured* when it says something about the backend, i.e. it is not one of
schema.EXCLUDED_FROM_DENOMINATOR (baseline_fail, not_available, skipped). Rules, in order:

    PASS      actual == expected (an expected failure that still fails the same way is a PASS too)
    FLAKY     the entry is listed in flaky.csv and its status differs; reported, never fatal
    MISSING   expected measured, but the run has no row or an unmeasured status (coverage was lost)
    NEW       the run has an entry the expected results do not list, or measured one they list as unmeasured
    IMPROVED  expected a failing status, got pass
    FAIL      expected measured, got a different measured status that is not pass. As in PyTorch's
              check_accuracy.py, any change of failure kind is a FAIL, not only pass -> failing: a
              fail_accuracy that now crashes is worse, and a crash that now fails accuracy still needs
              a human to look and `hf-tpu accept` it.

Both unmeasured but different (e.g. not_available -> skipped) is a PASS: nothing about the backend changed.

Exit status of `hf-tpu compare`: 1 on any FAIL or MISSING (MISSING allowed with --allow-missing, for runs of a
subset of the zoo); 1 on any IMPROVED or NEW unless --accept-improvements (the expected files are out of
date: run `hf-tpu accept`); otherwise 0. Bad input is 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import schema
from harness.ci import performance
from harness.ci._io import atomic_write_text
from harness.ci.expected import Expected
from harness.ci.runs import Run

CLASSES = ("FAIL", "MISSING", "IMPROVED", "NEW", "FLAKY", "PASS")  # most to least urgent
COMPARISON_CSV = "comparison.csv"
COMPARISON_MD = "comparison.md"
COMPARISON_COLUMNS = [
    "entry_id",
    "phase",
    "mode",
    "class",
    "expected",
    "actual",
    "error_type",
    "error_message",
    "failing_op",
    "note",
]


def is_measured(status: str | None) -> bool:
    return bool(status) and status not in schema.EXCLUDED_FROM_DENOMINATOR


def classify(expected: str | None, actual: str | None, flaky: bool = False) -> str:
    """The class of one (entry, mode); None means no row / not listed."""
    if actual == expected:
        return "PASS"
    if flaky and actual is not None and expected is not None:
        return "FLAKY"
    if is_measured(expected) and not is_measured(actual):
        return "MISSING"
    if not is_measured(expected):
        # Nothing measured was accepted: a measured result is new information, an unmeasured one is not.
        return "NEW" if is_measured(actual) or expected is None else "PASS"
    return "IMPROVED" if actual == "pass" else "FAIL"


@dataclass
class Comparison:
    table: pd.DataFrame  # COMPARISON_COLUMNS, sorted by class urgency then key

    def counts(self) -> dict[str, int]:
        vc = self.table["class"].value_counts()
        return {c: int(vc.get(c, 0)) for c in CLASSES}

    def counts_by_mode(self) -> pd.DataFrame:
        """Class counts per mode (inference) and per `train/<mode>` (the train phase), in schema order."""
        t = pd.crosstab(where_label(self.table), self.table["class"]) if len(self.table) else pd.DataFrame()
        return t.reindex(index=performance.where_order(t.index), columns=list(CLASSES), fill_value=0)

    def exit_code(self, accept_improvements: bool = False, allow_missing: bool = False) -> int:
        c = self.counts()
        if c["FAIL"] or (c["MISSING"] and not allow_missing):
            return 1
        if (c["IMPROVED"] or c["NEW"]) and not accept_improvements:
            return 1
        return 0

    def differences(self) -> pd.DataFrame:
        return self.table[self.table["class"] != "PASS"]


def where_label(table: pd.DataFrame) -> pd.Series:
    """'eager' for an inference row, 'train/eager' for a train row (a table without phases: inference)."""
    return performance.where(table)


def compare(run: Run, expected: Expected, scope: frozenset[str] | None = None,
            phases: frozenset[str] | None = None) -> Comparison:
    """Classify every (entry, phase, mode) in the union of the run and the expected results; with `scope`
    (the entry ids the run selected, harness.ci.scope), only the expected entries in it; with `phases` (the
    phases the run selected, scope.run_phases), only the expected rows of those phases: a train-only run owes
    no inference row. Without `phases`, the default phases and those the run swept are owed."""
    rows: dict[tuple[str, str, str], dict] = {}
    df = run.df.copy()
    df["phase"] = df["phase"].where(df["phase"] != "", "inference") if "phase" in df.columns else "inference"
    actual = df.set_index(["entry_id", "phase", "mode"])
    swept_modes, swept_phases = set(df["mode"]), set(df["phase"])
    # Expected entries in a default mode or phase the run never swept are still MISSING: a nightly that lost
    # its compiled shard must not pass. An opt-in mode (fused) or phase (train) is compared only in runs that
    # swept it.
    keys = set(actual.index) | {
        k for k in expected.status
        if (k[2] in schema.DEFAULT_MODES or k[2] in swept_modes)
        and (k[1] in phases if phases is not None else k[1] in schema.DEFAULT_PHASES or k[1] in swept_phases)
        and (scope is None or k[0] in scope)
    }
    for key in keys:
        entry_id, phase, mode = key
        exp = expected.status.get(key)
        row = actual.loc[key] if key in actual.index else None
        act = None if row is None else str(row["status"])
        flaky = expected.is_flaky(entry_id, mode, phase)
        cls = classify(exp, act, flaky)
        note = ""
        if flaky and cls in ("FLAKY", "PASS"):
            note = "flaky: " + (expected.flaky_reason(entry_id, mode, phase) or "listed in flaky.csv")
        elif act is None:
            note = "no row in the run"
        elif exp is None:
            note = "not in the expected results"
        rows[key] = {
            "entry_id": entry_id,
            "phase": phase,
            "mode": mode,
            "class": cls,
            "expected": exp or "",
            "actual": act or "",
            "error_type": "" if row is None else row["error_type"],
            "error_message": "" if row is None else row["error_message"],
            "failing_op": "" if row is None else row["failing_op"],
            "note": note,
        }
    table = pd.DataFrame(list(rows.values()), columns=COMPARISON_COLUMNS)
    order = {c: i for i, c in enumerate(CLASSES)}
    table = (
        table.assign(_o=table["class"].map(order))
        .sort_values(["_o", "entry_id", "phase", "mode"], kind="stable")
        .drop(columns="_o")
        .reset_index(drop=True)
    )
    return Comparison(table=table)


def comparison_markdown(comp: Comparison, run_name: str, expected_dir: Path) -> str:
    c = comp.counts()
    lines = [
        f"# Comparison of `{run_name}` with `{expected_dir}`",
        "",
        " · ".join(f"**{k}** {v}" for k, v in c.items()),
        "",
        "| mode | " + " | ".join(CLASSES) + " |",
        "|---|" + "---:|" * len(CLASSES),
    ]
    for mode, r in comp.counts_by_mode().iterrows():
        lines.append(f"| {mode} | " + " | ".join(str(int(r[k])) for k in CLASSES) + " |")
    diff = comp.differences()
    lines += ["", f"## Differences ({len(diff)})", ""]
    if diff.empty:
        lines.append("None: the run matches the expected results.")
    else:
        lines += ["| class | entry | mode | expected | actual | error | note |", "|---|---|---|---|---|---|---|"]
        for (_, r), where in zip(diff.iterrows(), where_label(diff), strict=True):
            err = f"{r['error_type']}: {r['error_message']}".strip(": ") if r["error_type"] else r["error_message"]
            lines.append(
                f"| {r['class']} | `{r['entry_id']}` | {where} | {r['expected'] or '-'} | {r['actual'] or '-'} "
                f"| {_md_cell(err)} | {_md_cell(r['note'])} |"
            )
    return "\n".join(lines) + "\n"


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def write_comparison(comp: Comparison, run: Run, expected_dir: Path) -> tuple[Path, Path]:
    """comparison.csv and comparison.md in the run directory, written atomically."""
    csv_path = run.path / COMPARISON_CSV
    md_path = run.path / COMPARISON_MD
    atomic_write_text(csv_path, comp.table.to_csv(index=False, lineterminator="\n"))
    atomic_write_text(md_path, comparison_markdown(comp, run.name, expected_dir))
    return csv_path, md_path



def load_comparison(run_dir: Path) -> pd.DataFrame | None:
    """comparison.csv from a run directory, if `hf-tpu compare` wrote one (the dashboard shows it)."""
    p = run_dir / COMPARISON_CSV
    if not p.is_file():
        return None
    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False, na_values=[])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return None
    return df if {"entry_id", "mode", "class"} <= set(df.columns) else None
