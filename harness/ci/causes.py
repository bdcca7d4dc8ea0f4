"""Why each row that proves nothing about the backend is what it is: the `fail_accuracy` rows, the
uninformative passes and the run failures, each attributed from one table (harness/ci/causes.yaml).

A row's measured columns say *that* it failed (or passed without evidence); why is a finding made by reading
its diagnosis, and it has to live somewhere the reports can read it rather than in hand-edited prose. The
table is that place: coverage.md (harness.ci.coverage) lists every such row with the cause found here, and a
row no table entry explains is shown as `unattributed`, so a new false alarm cannot hide among explained ones.

Table entries (a list under `causes:`):
- `match`: fnmatch pattern of entry ids; `modes`: the modes it covers (absent: all);
- `kind`: `fail_accuracy`, `uninformative` or a run-failure status (schema.RUN_FAILURES);
- `when` (optional): a regex the row's evidence (its `uninformative` text for uninformative rows, else its
  `error_message`) must match, for causes that are told apart by what was measured, not by the model;
- `cause`: one of CAUSES; `reason`: the finding, with the evidence that supports it.
The first entry that fits a row wins. A row that no entry fits keeps the attribution its control run gave it
(column `cause`: backend | upstream, for run failures and compiled fail_accuracy rows; harness/sweep/control.py),
with the control's error as the reason.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import schema
from harness.core.tables import md_cell

DEFAULT_CAUSES_FILE = Path(__file__).with_name("causes.yaml")

# backend: tpu computes something else than CPU would, a bug to fix here.
# upstream: the model or library does it on any backend (a float32 CPU against a float32 GPU would show it
#   too): data-dependent thresholds, chaotic selections, validation that breaks under tracing.
# harness: the harness's own limit (what it can compare or perturb), not a property of the backend.
# environment: the machine the sweep ran on (memory cap, time), not the code.
CAUSES = ("backend", "upstream", "harness", "environment")
KINDS = ("fail_accuracy", "uninformative", *schema.RUN_FAILURES)
UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class Cause:
    match: str
    kind: str
    cause: str
    reason: str
    modes: tuple[str, ...] = ()
    when: str = ""

    def fits(self, entry_id: str, mode: str, kind: str, evidence: str) -> bool:
        return (kind == self.kind and fnmatch.fnmatchcase(entry_id, self.match)
                and (not self.modes or mode in self.modes)
                and (not self.when or re.search(self.when, evidence) is not None))


class CausesError(ValueError):
    """A malformed causes table (names the entry and what is wrong)."""


def parse_causes(data: dict | None) -> list[Cause]:
    """The entries of a loaded causes table, validated (CausesError on an unknown key, kind or cause)."""
    out = []
    for i, e in enumerate((data or {}).get("causes") or []):
        where = f"causes[{i}] ({e.get('match', '?') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            raise CausesError(f"{where}: not a mapping")
        unknown = set(e) - {"match", "modes", "kind", "when", "cause", "reason"}
        if unknown:
            raise CausesError(f"{where}: unknown keys {sorted(unknown)}")
        for key in ("match", "kind", "cause", "reason"):
            if not str(e.get(key) or "").strip():
                raise CausesError(f"{where}: `{key}` is required")
        if e["kind"] not in KINDS:
            raise CausesError(f"{where}: kind {e['kind']!r} not in {KINDS}")
        if e["cause"] not in CAUSES:
            raise CausesError(f"{where}: cause {e['cause']!r} not in {CAUSES}")
        modes = e.get("modes") or ()
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
        if set(modes) - set(schema.MODES):
            raise CausesError(f"{where}: modes {modes} not among {schema.MODES}")
        when = str(e.get("when") or "")
        try:
            re.compile(when)
        except re.error as exc:
            raise CausesError(f"{where}: `when` is not a regex: {exc}") from exc
        out.append(Cause(str(e["match"]), str(e["kind"]), str(e["cause"]), " ".join(str(e["reason"]).split()),
                         modes, when))
    return out


def load_causes(path: str | Path | None = None) -> list[Cause]:
    import yaml

    p = Path(path) if path else DEFAULT_CAUSES_FILE
    if not p.exists():
        return []
    return parse_causes(yaml.safe_load(p.read_text()))


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    return df[name].fillna("").astype(str)


def rows_to_explain(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that prove nothing about the backend's numerics, with their kind: fail_accuracy, uninformative
    (a row that ran whose baseline outputs carry no information) or a run failure's status."""
    un = _col(df, "uninformative") != ""
    st = df["status"].astype(str)
    keep = (st == "fail_accuracy") | (un & st.isin(("pass", "fail_accuracy"))) | st.isin(schema.RUN_FAILURES)
    out = df[keep].copy()
    out["kind"] = st[keep].where(~(un[keep] & st[keep].isin(("pass", "fail_accuracy"))), "uninformative")
    out["evidence"] = _col(out, "uninformative").where(out["kind"] == "uninformative", _col(out, "error_message"))
    return out


EXPLAIN_COLUMNS = ["entry_id", "mode", "status", "kind", "cause", "reason", "evidence"]


def explain(df: pd.DataFrame, causes: list[Cause] | None = None) -> pd.DataFrame:
    """One row per row to explain (rows_to_explain): its cause and reason from the table (the first entry that
    fits), else a run failure's control attribution, else `unattributed`. Sorted by kind, cause, entry, mode."""
    causes = load_causes() if causes is None else causes
    r = rows_to_explain(df)
    control, control_error = _col(r, "cause"), _col(r, "control_error")
    recs = []
    for idx, row in r.iterrows():
        mode = str(row.get("mode", ""))
        hit = next((c for c in causes if c.fits(row["entry_id"], mode, row["kind"], row["evidence"])), None)
        if hit is not None:
            cause, reason = hit.cause, hit.reason
        elif row["kind"] != "uninformative" and control[idx]:
            # the control run's attribution (harness/sweep/control.py), with how the control failed if it did
            cause = control[idx]
            reason = (f"control (aot_eager on CPU): {control_error[idx]}" if control_error[idx]
                      else "the control (aot_eager on CPU, or the CPU baseline in eager) works")
        else:
            cause, reason = UNATTRIBUTED, ""
        recs.append({"entry_id": row["entry_id"], "mode": mode, "status": row["status"], "kind": row["kind"],
                     "cause": cause, "reason": reason, "evidence": str(row["evidence"])})
    t = pd.DataFrame(recs, columns=EXPLAIN_COLUMNS)
    order = {k: i for i, k in enumerate(KINDS)}
    t["_k"] = t["kind"].map(order)
    t["_c"] = (t["cause"] != UNATTRIBUTED).astype(int)  # unattributed first: they need a look
    return (t.sort_values(["_k", "_c", "cause", "entry_id", "mode"], kind="stable")
            .drop(columns=["_k", "_c"]).reset_index(drop=True))


def unused(df: pd.DataFrame, causes: list[Cause]) -> list[Cause]:
    """Table entries that fit no row of df (stale once a row they explained passes)."""
    r = rows_to_explain(df)
    return [c for c in causes
            if not any(c.fits(row["entry_id"], str(row.get("mode", "")), row["kind"], row["evidence"])
                       for _, row in r.iterrows())]


_TITLES = {"fail_accuracy": "Accuracy failures", "uninformative": "Uninformative rows (not numerics passes)"}


def causes_markdown(df: pd.DataFrame, causes: list[Cause] | None = None) -> str:
    """coverage.md's section: each row that is not a numerics proof with its cause and reason, by kind."""
    t = explain(df, causes)
    if t.empty:
        return ""
    counts = t.groupby(["kind", "cause"]).size()
    lines = ["## Causes of the rows that prove nothing", "",
             "Every `fail_accuracy` row, uninformative row and run failure, with its cause from "
             "harness/ci/causes.yaml (`backend`: tpu computes something else, to fix; `upstream`: the model or "
             "library does it on any backend; `harness`: the harness's own limit; `environment`: the machine). "
             f"`{UNATTRIBUTED}`: no finding yet.", ""]
    for kind in [k for k in KINDS if k in set(t["kind"])]:
        part = t[t["kind"] == kind]
        summary = ", ".join(f"{c} {int(counts[(kind, c)])}" for c in dict.fromkeys(part["cause"]))
        lines += [f"### {_TITLES.get(kind, kind)} ({len(part)}: {summary})", "",
                  "| entry | mode | cause | reason | measured |", "|---|---|---|---|---|"]
        for _, x in part.iterrows():
            ev = x["evidence"] if len(x["evidence"]) <= 160 else x["evidence"][:159] + "…"
            lines.append(f"| `{x['entry_id']}` | {x['mode']} | {x['cause']} | {md_cell(x['reason'])} "
                         f"| {md_cell(ev)} |")
        lines.append("")
    return "\n".join(lines)
