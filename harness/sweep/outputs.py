"""Reports of a run, from its results frame: coverage.md (the headline figures and coverage by mode, task and
library, each with its denominator), crashes.md (errors grouped by root cause) and numerics.md (worst
entries). `headline` and `coverage_table` are the one place the figures are computed."""

from __future__ import annotations

import math
from pathlib import Path

from harness.schema import EXCLUDED_FROM_DENOMINATOR, RUN_FAILURES, STATUSES
from harness.sweep import errors
from harness.sweep.results import RESULTS_CSV, atomic_write, write_csv

DEFINITIONS = (
    "- **crash-free %** = rows that ran without a run failure (not "
    + ", ".join(f"`{s}`" for s in RUN_FAILURES)
    + ") / rows that count (all rows but "
    + ", ".join(f"`{s}`" for s in EXCLUDED_FROM_DENOMINATOR)
    + ").\n- **numerics-match %** = `pass` / rows that ran to the end (`pass` + `fail_accuracy`).\n"
    "- **pass %** = `pass` / rows that count: both at once.\n"
)


def _pct(n: int, d: int) -> float:
    return 100.0 * n / d if d else math.nan


def headline(df) -> dict:
    """The two headline figures of a results frame, with their numerators and denominators."""
    status = df["status"]
    counted = int((~status.isin(EXCLUDED_FROM_DENOMINATOR)).sum())
    crash_free = int((~status.isin(EXCLUDED_FROM_DENOMINATOR) & ~status.isin(RUN_FAILURES)).sum())
    passed = int((status == "pass").sum())
    ran = int(status.isin(("pass", "fail_accuracy")).sum())
    return {
        "rows": int(len(df)), "entries": int(df["entry_id"].nunique()) if len(df) else 0,
        "counted": counted, "crash_free": crash_free, "crash_free_pct": _pct(crash_free, counted),
        "ran": ran, "passed": passed, "numerics_match_pct": _pct(passed, ran), "pass_pct": _pct(passed, counted),
        "excluded": {s: int((status == s).sum()) for s in EXCLUDED_FROM_DENOMINATOR},
        "statuses": {s: int((status == s).sum()) for s in STATUSES if (status == s).any()},
    }


def coverage_table(df, by: str | None = None):
    """Headline figures per value of column `by` (overall when None), as a frame."""
    import pandas as pd

    groups = [("all", df)] if by is None else sorted(df.groupby(by, dropna=False), key=lambda g: str(g[0]))
    recs = []
    for key, g in groups:
        h = headline(g)
        recs.append({by or "scope": key, "rows": h["rows"], "counted": h["counted"], "crash_free": h["crash_free"],
                     "crash_free_pct": h["crash_free_pct"], "ran": h["ran"], "passed": h["passed"],
                     "numerics_match_pct": h["numerics_match_pct"], "pass_pct": h["pass_pct"],
                     **{s: int((g["status"] == s).sum()) for s in STATUSES}})
    return pd.DataFrame(recs)


def fmt_pct(value: float, num: int, den: int) -> str:
    return "n/a (0/0)" if not den else f"{value:.1f}% ({num}/{den})"


def headline_text(df) -> str:
    h = headline(df)
    return (f"crash-free {fmt_pct(h['crash_free_pct'], h['crash_free'], h['counted'])}, "
            f"numerics-match {fmt_pct(h['numerics_match_pct'], h['passed'], h['ran'])}, "
            f"pass {fmt_pct(h['pass_pct'], h['passed'], h['counted'])}")


def md_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _coverage_md_section(df, by: str) -> str:
    t = coverage_table(df, by)
    present = [s for s in STATUSES if t[s].sum() > 0]
    rows = [[r[by], fmt_pct(r["crash_free_pct"], r["crash_free"], r["counted"]),
             fmt_pct(r["numerics_match_pct"], r["passed"], r["ran"]), *(r[s] for s in present)]
            for _, r in t.iterrows()]
    return md_table([by, "crash-free", "numerics-match", *present], rows)


def coverage_md(df, title: str = "") -> str:
    h = headline(df)
    parts = [f"# Coverage{(': ' + title) if title else ''}\n",
             f"- **crash-free**: {fmt_pct(h['crash_free_pct'], h['crash_free'], h['counted'])}",
             f"- **numerics-match**: {fmt_pct(h['numerics_match_pct'], h['passed'], h['ran'])}",
             f"- pass: {fmt_pct(h['pass_pct'], h['passed'], h['counted'])}",
             f"- rows: {h['rows']} ({h['entries']} entries); left out of the denominators: "
             + ", ".join(f"{k} {v}" for k, v in h["excluded"].items()) + "\n",
             DEFINITIONS,
             "## Status counts\n",
             md_table(["status", "rows"], [[s, n] for s, n in h["statuses"].items()])]
    for by in ("mode", "task", "library"):
        parts += [f"\n## By {by}\n", _coverage_md_section(df, by)]
    return "\n".join(parts)


def crash_groups(df):
    """Run failures grouped by root cause: located op, else failing op, else (exception type, normalised
    message). Sorted by entries affected."""
    import pandas as pd

    fails = df[df["status"].isin(RUN_FAILURES)].copy()
    if fails.empty:
        return pd.DataFrame(columns=["root_cause", "statuses", "entries", "rows", "modes", "examples"])

    def cause(r):
        op = r.get("located_op") or r.get("failing_op")
        if op:
            return f"{op} ({r['error_type']})" if r["error_type"] else op
        return f"{r['error_type'] or r['status']}: {errors.group_message(r['error_message'])}".rstrip(": ")

    fails["root_cause"] = fails.apply(cause, axis=1)
    recs = []
    for key, g in fails.groupby("root_cause"):
        ids = sorted(g["entry_id"].unique())
        recs.append({"root_cause": key, "statuses": ",".join(sorted(g["status"].unique())), "entries": len(ids),
                     "rows": len(g), "modes": ",".join(sorted(g["mode"].unique())),
                     "examples": ", ".join(ids[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "")})
    return pd.DataFrame(recs).sort_values(["entries", "rows", "root_cause"], ascending=[False, False, True])


def crashes_md(df) -> str:
    t = crash_groups(df)
    head = "# Run failures by root cause\n\nStatuses " + ", ".join(f"`{s}`" for s in RUN_FAILURES) + \
        "; sorted by entries affected.\n\n"
    if t.empty:
        return head + "No run failures.\n"
    return head + md_table(["root cause", "status", "entries", "rows", "modes", "examples"],
                           t[["root_cause", "statuses", "entries", "rows", "modes", "examples"]].values.tolist())


def worst_numerics(df, n: int = 25):
    ran = df[df["status"].isin(("pass", "fail_accuracy"))].copy()
    ran["_fail"] = ran["status"].eq("fail_accuracy")
    ran["_ratio"] = ran["rmse_ratio"].fillna(-1.0)
    ran["_rel"] = ran["max_rel_err"].fillna(-1.0)
    ran = ran.sort_values(["_fail", "_ratio", "_rel"], ascending=False)
    return ran.head(n)


def _g(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def numerics_md(df, n: int = 25) -> str:
    t = worst_numerics(df, n)
    head = (f"# Worst numerics\n\nThe {n} worst rows that ran to the end: `fail_accuracy` first, then by rmse "
            "ratio (rmse(fp64, tpu) / rmse(fp64, cpu)) and max relative error.\n\n")
    if t.empty:
        return head + "No rows ran to the end.\n"
    rows = [[r["entry_id"], r["mode"], r["status"], _g(r["max_abs_err"]), _g(r["max_rel_err"]), _g(r["cosine"]),
             _g(r["rmse_ratio"]), r.get("located_op", ""), r["error_message"]] for _, r in t.iterrows()]
    return head + md_table(["entry", "mode", "status", "max abs err", "max rel err", "cosine", "rmse ratio",
                            "located op", "detail"], rows)


def write_reports(df, out: Path, title: str = "") -> dict[str, Path]:
    out = Path(out)
    paths = {"results": out / RESULTS_CSV, "coverage": out / "coverage.md", "crashes": out / "crashes.md",
             "numerics": out / "numerics.md"}
    write_csv(df, paths["results"])
    atomic_write(paths["coverage"], coverage_md(df, title).encode())
    atomic_write(paths["crashes"], crashes_md(df).encode())
    atomic_write(paths["numerics"], numerics_md(df).encode())
    return paths
