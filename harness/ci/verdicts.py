"""How far the numerics verdicts can be trusted, from a results frame: rows whose comparison says nothing
(uninformative baseline outputs), rows judged without their float64 reference (it disagreed with the
baseline), nondeterministic rows, and the canary's sensitivity figure (`hf-tpu sweep --canary`).
coverage.md shows these as one section (`verdicts_markdown`); harness.ci.coverage leaves uninformative
rows out of the numerics-match figure."""

from __future__ import annotations

import pandas as pd

from harness.core.tables import Figure, md_cell

LIST_MAX = 40


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    return df[name].fillna("").astype(str)


def uninformative_mask(df: pd.DataFrame) -> pd.Series:
    return _col(df, "uninformative") != ""


def canary_outcomes(df: pd.DataFrame) -> pd.Series:
    """caught | missed | untouched | error | '' per row (the first word of the `canary` column)."""
    return _col(df, "canary").str.split(" ", n=1).str[0].fillna("")


def sensitivity(df: pd.DataFrame) -> Figure:
    """Rows whose faulty outputs differ from the clean ones, and of those how many the rule failed.
    Uninformative rows are left out: their pass was not a numerics pass to begin with."""
    o = canary_outcomes(df)[~uninformative_mask(df)]
    return Figure(int((o == "caught").sum()), int(o.isin(("caught", "missed")).sum()))


def _fault(df: pd.DataFrame) -> str:
    c = _col(df, "canary")
    faults = c[c != ""].str.extract(r"\(([a-z]+:[0-9.eE+-]+)")[0].dropna().unique()
    return ", ".join(faults) if len(faults) else "the fault"


def _rows(df: pd.DataFrame, col: str) -> list[str]:
    out = [f"| `{r['entry_id']}` | {r['mode']} | {md_cell(r[col])} |" for _, r in df.head(LIST_MAX).iterrows()]
    if len(df) > LIST_MAX:
        out.append(f"| … (+{len(df) - LIST_MAX}) | | |")
    return out


def verdicts_markdown(df: pd.DataFrame) -> str:
    """The section of coverage.md about the verdicts themselves ('' when the frame has none of the columns)."""
    if not len(df) or not any(c in df.columns for c in ("uninformative", "reference", "canary")):
        return ""
    lines = ["## Numerics verdicts", "",
             "The rule is in harness/sweep/numerics.py, its tolerances in harness/sweep/tolerances.yaml, "
             "the reasoning in docs/numerics.md.", ""]
    ran = df[df["status"].isin(("pass", "fail_accuracy"))]
    c = _col(df, "canary")
    if (c != "").any():
        s = sensitivity(df)
        o = canary_outcomes(df)
        lines += [f"- **canary**: a {_fault(df)} fault is caught in {s} of the passing rows whose outputs it "
                  f"changes; {int((o == 'untouched').sum())} passing rows untouched by it (bit-identical outputs: "
                  f"no such op on the output's path), {int((o == 'error').sum())} where the faulty run raised"]
    un = ran[uninformative_mask(ran)]
    lines.append(f"- **uninformative** (not counted as numerics passes): {len(un)} rows")
    ref = _col(ran, "reference")
    bad_ref = ran[ref.str.startswith("invalid")]
    lines.append(f"- **float64 reference invalid** (disagrees with the baseline beyond its noise; judged by the "
                 f"direct comparison): {len(bad_ref)} rows; no float64 reference at all (it raised): "
                 f"{int(ref.str.startswith('none').sum())} rows")
    nd = ran[_col(ran, "nondeterministic") != ""]
    lines.append(f"- **nondeterministic** (two tpu runs of the same inputs differed): {len(nd)} rows")
    lines.append("")
    if (c != "").any():
        o = canary_outcomes(df)
        missed = df[(o == "missed") & ~uninformative_mask(df)]
        lines += [f"### Canary missed ({len(missed)})", ""]
        lines += (["| entry | mode | canary |", "|---|---|---|", *_rows(missed, "canary")] if len(missed) else ["None."])
        untouched = df[o.isin(("untouched", "error"))]
        lines += ["", f"### Canary untouched ({len(untouched)})", "",
                  "The fault did not change these outputs at all, so no rule could catch it there.", ""]
        lines += (["| entry | mode | canary |", "|---|---|---|", *_rows(untouched, "canary")] if len(untouched)
                  else ["None."])
        lines.append("")
    for title, sub, col in (("Uninformative rows", un, "uninformative"),
                            ("Rows with an invalid float64 reference", bad_ref, "reference"),
                            ("Nondeterministic rows", nd, "nondeterministic")):
        if len(sub):
            lines += [f"### {title} ({len(sub)})", "", "| entry | mode | why |", "|---|---|---|",
                      *_rows(sub, col), ""]
    return "\n".join(lines) + "\n"
