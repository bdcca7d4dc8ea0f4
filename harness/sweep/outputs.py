"""Reports of a run, from its results frame: results.csv, coverage.md (headline figures with denominators,
coverage by mode, task family and library, crash table, worst numerics), crashes.md (run failures grouped by
root cause) and numerics.md (worst entries). The figures are computed in ONE place, harness.ci.coverage,
shared with the dashboard; this module only lays them out."""

from __future__ import annotations

from pathlib import Path

from harness.ci import coverage
from harness.schema import RUN_FAILURES
from harness.sweep.results import RESULTS_CSV, atomic_write, write_csv

CRASH_TOP = 50
WORST_NUMERICS = 25


def headline(df) -> dict:
    """The headline figures as plain numbers (for run.json and the CLI)."""
    h = coverage.headline(df)
    return {"rows": h.rows, "excluded": h.excluded,
            "crash_free": h.crash_free.num, "counted": h.crash_free.den, "crash_free_pct": h.crash_free.pct,
            "counted_control": h.crash_free_control.den, "crash_free_control_pct": h.crash_free_control.pct,
            "upstream": h.upstream,
            "passed": h.numerics_match.num, "ran": h.numerics_match.den, "numerics_match_pct": h.numerics_match.pct,
            "entries": int(df["entry_id"].nunique()) if len(df) else 0,
            "statuses": {k: int(v) for k, v in df["status"].value_counts().items()}}


def headline_text(df) -> str:
    h = coverage.headline(df)
    return (f"crash-free {h.crash_free} (where the control works {h.crash_free_control}), "
            f"numerics-match {h.numerics_match}")


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(coverage._md("" if v is None else v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def crashes_md(df) -> str:
    t = coverage.crash_table(df)
    head = ("# Run failures by root cause\n\nStatuses " + ", ".join(f"`{s}`" for s in RUN_FAILURES)
            + "; grouped by cause (`backend`: aot_eager on CPU runs the entry; `upstream`: it fails too; `?`: no "
            "control ran), then by (failing op, exception type, normalised message), sorted by entries affected.\n\n")
    if t.empty:
        return head + "No run failures.\n"
    t = t.assign(cause=t["cause"].where(t["cause"] != "", "?"))
    cols = ["cause", "entries", "rows", "failing_op", "error_type", "message", "statuses", "modes", "examples"]
    return head + md_table(["cause", "entries", "rows", "failing op", "error", "message", "statuses", "modes",
                            "examples"],
                           t[cols].head(CRASH_TOP).values.tolist())


def numerics_md(df) -> str:
    t = coverage.worst_numerics(df, WORST_NUMERICS)
    head = (f"# Worst numerics\n\nThe {WORST_NUMERICS} worst rows that ran to the end: `fail_accuracy` first, then "
            "by rmse ratio = rmse(fp64, tpu) / rmse(fp64, cpu), max relative error, cosine. The rule is in "
            "harness/sweep/numerics.py.\n\n")
    if t.empty:
        return head + "No rows ran to the end with metrics.\n" + _unmeasured_md(df)
    f = coverage.fmt_num
    rows = [[f"`{r['entry_id']}`", r["mode"], r["status"], r["dtype"], r["precision"], f(r["max_abs_err"]),
             f(r["max_rel_err"]), f(r["cosine"], 6, fixed=True), f(r["rmse_ratio"])] for _, r in t.iterrows()]
    body = md_table(["entry", "mode", "status", "dtype", "precision", "max abs err", "max rel err", "cosine",
                     "rmse ratio"], rows)
    return head + body + _unmeasured_md(df)


def _unmeasured_md(df) -> str:
    """`fail_accuracy` rows without metrics (output names or shapes differ): not in the ranked table."""
    metrics = ["max_abs_err", "max_rel_err", "cosine", "rmse_ratio"]
    bad = df[(df["status"] == "fail_accuracy") & df[metrics].isna().all(axis=1)]
    if bad.empty:
        return ""
    return ("\n## Accuracy failures without metrics\n\nOutput names or shapes differ from the baseline.\n\n"
            + md_table(["entry", "mode", "detail"], [[f"`{r['entry_id']}`", r["mode"], r["error_message"]]
                                                     for _, r in bad.iterrows()]))


def write_reports(df, out: Path, title: str = "") -> dict[str, Path]:
    out = Path(out)
    paths = {"results": out / RESULTS_CSV, "coverage": out / "coverage.md", "crashes": out / "crashes.md",
             "numerics": out / "numerics.md"}
    write_csv(df, paths["results"])
    md = coverage.coverage_markdown(df, worst=WORST_NUMERICS)
    if title:
        md = md.replace("# Coverage\n", f"# Coverage: {title}\n", 1)
    atomic_write(paths["coverage"], md.encode())
    atomic_write(paths["crashes"], crashes_md(df).encode())
    atomic_write(paths["numerics"], numerics_md(df).encode())
    return paths
