"""Coverage figures from a results DataFrame (rows as in harness.schema): the two headline figures, their
breakdown by any column, the crash table by root cause and the worst numerics.

Definitions (one place, used by the dashboard and available to the sweep's coverage.md):
- denominator rows: status not in schema.EXCLUDED_FROM_DENOMINATOR (baseline_fail, not_available, skipped
  say nothing about the backend);
- crash-free %: denominator rows whose status is not in schema.RUN_FAILURES, over the denominator;
- crash-free where the control works %: the same over the denominator rows whose `cause` is not `upstream`
  (a compile_fail/fail_to_run row whose control, aot_eager on CPU, fails too: no backend could run it);
- numerics-match %: `pass` rows over the rows that ran (pass + fail_accuracy), i.e. of the rows that
  produced outputs, how many matched the baseline; rows whose baseline outputs are uninformative (column
  `uninformative`: zeros, constant, ...) are left out of both, since any backend matches them.
A figure with an empty denominator has pct None (shown as "n/a"), never 0 % or 100 %.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from harness import schema
from harness.ci import performance
from harness.ci.causes import causes_markdown
from harness.ci.verdicts import verdicts_markdown
from harness.core.tables import Figure, fmt_num, fmt_pct, md_cell  # noqa: F401 - re-exported

RAN = ("pass", "fail_accuracy")

_where, _where_order = performance.where, performance.where_order  # phase/mode labels: 'eager', 'train/eager'


@dataclass(frozen=True)
class Headline:
    rows: int  # all rows
    excluded: int  # rows left out of the denominators
    crash_free: Figure
    numerics_match: Figure
    crash_free_control: Figure  # over the rows whose control works (cause != upstream)
    upstream: int  # run failures whose control fails too


def in_denominator(df: pd.DataFrame) -> pd.Series:
    return ~df["status"].isin(schema.EXCLUDED_FROM_DENOMINATOR)


def cause_of(df: pd.DataFrame) -> pd.Series:
    """The `cause` column ('' where absent: frames of schema version 1)."""
    if "cause" not in df.columns:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    return df["cause"].fillna("").astype(str)


def headline(df: pd.DataFrame) -> Headline:
    """Crash-free % (over all rows, and over rows whose control works) and numerics-match % of df."""
    st = df["status"]
    den = int(in_denominator(df).sum())
    crash = st.isin(schema.RUN_FAILURES)
    crashes = int(crash.sum())
    upstream = int((crash & (cause_of(df) == "upstream")).sum())
    informative = df["uninformative"].fillna("").astype(str) == "" if "uninformative" in df.columns else True
    ran = int((st.isin(RAN) & informative).sum())
    passed = int(((st == "pass") & informative).sum())
    return Headline(
        rows=len(df),
        excluded=len(df) - den,
        crash_free=Figure(den - crashes, den),
        numerics_match=Figure(passed, ran),
        crash_free_control=Figure(den - crashes, den - upstream),
        upstream=upstream,
    )


def coverage_by(df: pd.DataFrame, by: str | list[str]) -> pd.DataFrame:
    """One row per value of `by` (e.g. "mode", "task", "library"): the headline figures and status counts.

    Columns: by..., rows, excluded, denominator, crash_free, crash_free_pct, ran, numerics_match,
    numerics_match_pct, denominator_control, crash_free_control_pct, upstream, then one count column per status in schema.STATUSES (named after the status).
    Sorted by `by` (modes in schema.MODES order). A group with an empty denominator has pct NaN.
    """
    keys = [by] if isinstance(by, str) else list(by)
    out = []
    for val, g in df.groupby(keys, sort=True, dropna=False):
        h = headline(g)
        vals = val if isinstance(val, tuple) else (val,)
        rec = dict(zip(keys, vals, strict=True))
        rec.update(
            rows=h.rows,
            excluded=h.excluded,
            denominator=h.crash_free.den,
            crash_free=h.crash_free.num,
            crash_free_pct=h.crash_free.pct,
            ran=h.numerics_match.den,
            numerics_match=h.numerics_match.num,
            numerics_match_pct=h.numerics_match.pct,
            denominator_control=h.crash_free_control.den,
            crash_free_control_pct=h.crash_free_control.pct,
            upstream=h.upstream,
        )
        vc = g["status"].value_counts()
        rec.update({s: int(vc.get(s, 0)) for s in schema.STATUSES})
        out.append(rec)
    cols = keys + [
        "rows",
        "excluded",
        "denominator",
        "crash_free",
        "crash_free_pct",
        "ran",
        "numerics_match",
        "numerics_match_pct",
        "denominator_control",
        "crash_free_control_pct",
        "upstream",
        *schema.STATUSES,
    ]
    t = pd.DataFrame(out, columns=cols)
    if "mode" in keys:
        rank = {m: i for i, m in enumerate(schema.MODES)}
        t = t.sort_values(keys, key=lambda c: c.map(rank).fillna(len(rank)) if c.name == "mode" else c, kind="stable")
    return t.reset_index(drop=True)


_HEX = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@]+){2,}/?")
_NUM = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
_SPACE = re.compile(r"\s+")


def normalise_message(msg: str, limit: int = 160) -> str:
    """Strip what varies between occurrences of one root cause: addresses, paths, numbers (sizes, shapes,
    timings). Identifiers such as `float32` or `aten::add.Tensor` are kept: they name the cause."""
    s = str(msg or "").strip().splitlines()[0] if str(msg or "").strip() else ""
    s = _HEX.sub("0x…", s)
    s = _PATH.sub("<path>", s)
    s = _NUM.sub("N", s)
    s = _SPACE.sub(" ", s).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


CRASH_COLUMNS = ["cause", "failing_op", "error_type", "message", "entries", "rows", "statuses", "modes", "examples",
                 "located_op", "located_modules"]


def _located(df: pd.DataFrame, col: str) -> pd.Series:
    """A diagnose column (`hf-tpu sweep --diagnose`), '' where absent or not diagnosed."""
    if col not in df.columns:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    s = df[col].fillna("").astype(str)
    return s.where(~s.str.startswith("<diagnose"), "")


def _modules(g: pd.DataFrame, n: int = 3) -> str:
    mods = [m for m in g["_module"].value_counts().index if m]
    return ", ".join(mods[:n]) + (f", … (+{len(mods) - n})" if len(mods) > n else "")


CAUSE_ORDER = {"backend": 0, "upstream": 1, "": 2}


def crash_table(df: pd.DataFrame, examples: int = 3) -> pd.DataFrame:
    """Run failures (schema.RUN_FAILURES) grouped by cause first (backend, upstream, then '' = no control ran:
    timeouts, crashes, rows of schema version 1), then root cause = (op, error_type, normalised message), where
    op is the row's located_op when `hf-tpu sweep --diagnose` found one, else its failing_op; within a cause
    sorted by distinct entries affected (then rows). `examples` entry ids are listed per group, with the located op and the
    modules it was called from (most frequent first)."""
    f = df[df["status"].isin(schema.RUN_FAILURES)].copy()
    if f.empty:
        return pd.DataFrame(columns=CRASH_COLUMNS)
    f["message"] = f["error_message"].map(normalise_message)
    f["_located"] = _located(f, "located_op")
    f["_module"] = _located(f, "located_module")
    f["_op"] = f["_located"].where(f["_located"] != "", f["failing_op"])
    f["_cause"] = cause_of(f)
    out = []
    for (cause, _, et, msg), g in f.groupby(["_cause", "_op", "error_type", "message"], sort=False):
        ids = sorted(g["entry_id"].unique())
        ops = list(dict.fromkeys(g["failing_op"]))
        out.append(
            {
                "cause": cause,
                "failing_op": ops[0] if len(ops) == 1 else ", ".join(o for o in ops if o),
                "error_type": et,
                "message": msg,
                "entries": len(ids),
                "rows": len(g),
                "statuses": ", ".join(sorted(g["status"].unique())),
                "modes": ", ".join(_where_order(_where(g))),
                "examples": ", ".join(ids[:examples]) + (f", … (+{len(ids) - examples})" if len(ids) > examples else ""),
                "located_op": ", ".join(o for o in dict.fromkeys(g["_located"]) if o),
                "located_modules": _modules(g),
            }
        )
    t = pd.DataFrame(out, columns=CRASH_COLUMNS)
    t["_rank"] = t["cause"].map(CAUSE_ORDER).fillna(len(CAUSE_ORDER))
    return t.sort_values(
        ["_rank", "entries", "rows", "failing_op", "error_type", "message"],
        ascending=[True, False, False, True, True, True],
        kind="stable",
    ).drop(columns="_rank").reset_index(drop=True)


NUMERICS_COLUMNS = [
    "entry_id",
    "mode",
    "library",
    "task",
    "status",
    "dtype",
    "precision",
    "max_abs_err",
    "max_rel_err",
    "cosine",
    "rmse_ratio",
    "located_module",
    "located_op",
    "where",
]


def worst_numerics(df: pd.DataFrame, n: int = 20) -> pd.DataFrame:
    """The n rows that ran with the worst numerics: fail_accuracy first, then by rmse_ratio (the fp64 rule),
    max_rel_err (descending) and cosine (ascending); rows without any metric are left out."""
    r = df[df["status"].isin(RAN)]
    metrics = ["max_abs_err", "max_rel_err", "cosine", "rmse_ratio"]
    r = r[r[metrics].notna().any(axis=1)].copy()
    r["located_module"] = _located(r, "located_module")
    r["located_op"] = _located(r, "located_op")
    r["where"] = _where(r)
    r["_fail"] = r["status"] == "fail_accuracy"
    r = r.sort_values(
        ["_fail", "rmse_ratio", "max_rel_err", "cosine", "entry_id", "mode"],
        ascending=[False, False, False, True, True, True],
        na_position="last",
        kind="stable",
    )
    return r[NUMERICS_COLUMNS].head(n).reset_index(drop=True)


NUMERICS_BY_OP_COLUMNS = ["located_op", "entries", "rows", "max_rel_err", "cosine", "modes", "located_modules",
                          "examples"]


def numerics_by_op(df: pd.DataFrame, examples: int = 3) -> pd.DataFrame:
    """`fail_accuracy` rows grouped by the ATen op `hf-tpu sweep --diagnose` located ('' = not located: no
    diagnosis, or no single op differs on the same inputs), sorted by distinct entries affected; the worst max
    relative error and lowest cosine of each group, and the modules the op was called from."""
    f = df[df["status"] == "fail_accuracy"].copy()
    if f.empty:
        return pd.DataFrame(columns=NUMERICS_BY_OP_COLUMNS)
    f["_op"] = _located(f, "located_op")
    f["_module"] = _located(f, "located_module")
    out = []
    for op, g in f.groupby("_op", sort=False):
        ids = sorted(g["entry_id"].unique())
        out.append(
            {
                "located_op": op,
                "entries": len(ids),
                "rows": len(g),
                "max_rel_err": g["max_rel_err"].max(),
                "cosine": g["cosine"].min(),
                "modes": ", ".join(_where_order(_where(g))),
                "located_modules": _modules(g),
                "examples": ", ".join(ids[:examples]) + (f", … (+{len(ids) - examples})" if len(ids) > examples else ""),
            }
        )
    t = pd.DataFrame(out, columns=NUMERICS_BY_OP_COLUMNS)
    t["_unlocated"] = t["located_op"] == ""
    t = t.sort_values(["_unlocated", "entries", "rows", "located_op"], ascending=[True, False, False, True],
                      kind="stable")
    return t.drop(columns="_unlocated").reset_index(drop=True)


PRECISION_MEANING = {
    "highest": "float32 matmuls",
    "high": "float32 matmuls as three bfloat16 passes",
    "medium": "float32 matmuls with bfloat16 products, TorchTPU's default",
}


def configuration(df: pd.DataFrame) -> str:
    """Which precision and dtype the rows ran at (a headline means nothing without them)."""
    def values(col: str) -> list[str]:
        return sorted(str(v) for v in df[col].dropna().unique()) if col in df else []

    precisions = values("precision")
    text = ", ".join(f"precision {p} ({PRECISION_MEANING.get(p, p)})" for p in precisions) or "precision unknown"
    text += f"; dtype {', '.join(values('dtype')) or 'unknown'}"
    if any(p != "highest" for p in precisions):
        text += "; the CPU baseline computed in IEEE float32 with the tpu's rounding applied (docs/numerics.md)"
    return text


def coverage_markdown(df: pd.DataFrame, worst: int = 20) -> str:
    """coverage.md: headline figures, coverage by mode/task/library, crash table, verdicts, the cause of each row
    that is no numerics proof (harness.ci.causes), worst numerics."""
    h = headline(df)
    lines = [
        "# Coverage",
        "",
        f"- **crash-free**: {h.crash_free}",
        f"- **crash-free where the control works**: {h.crash_free_control} ({h.upstream} run failures are "
        "`upstream`: aot_eager on CPU fails too)",
        f"- **numerics-match**: {h.numerics_match}",
        f"- rows: {h.rows}, of which {h.excluded} excluded from the denominators "
        f"({', '.join(schema.EXCLUDED_FROM_DENOMINATOR)})",
        f"- **configuration**: {configuration(df)}",
        "",
    ]
    phase = performance.phase_of(df)
    phases = [p for p in schema.PHASES if p in set(phase)] + sorted(set(phase) - set(schema.PHASES))
    if phases != ["inference"]:  # the headline of each phase: a train row is not an inference row
        for ph in phases:
            hp = headline(df[phase == ph])
            lines.insert(len(lines) - 1, f"- **{ph}**: crash-free {hp.crash_free}, where the control works "
                                         f"{hp.crash_free_control}, numerics-match {hp.numerics_match}")
    df_where = df.assign(where=performance.where(df))
    tables = [("where", "mode", df_where, "phase/mode" if phases != ["inference"] else "mode")]
    for col, title in (("task", "task family"), ("library", "library")):
        tables += [(col, title + ("" if phases == ["inference"] else f" ({ph})"), df[phase == ph], title)
                   for ph in phases]
    for col, title, part, header in tables:
        t = coverage_by(part, col)
        if col == "where":
            t = t.set_index("where").loc[performance.where_order(t["where"])].reset_index()
        lines += [f"## By {title}", "",
                  f"| {header} | crash-free | crash-free (control works) | numerics-match | excluded |",
                  "|---|---:|---:|---:|---:|"]
        for _, r in t.iterrows():
            lines.append(
                f"| {r[col]} | {Figure(r['crash_free'], r['denominator'])} "
                f"| {Figure(r['crash_free'], r['denominator_control'])} "
                f"| {Figure(r['numerics_match'], r['ran'])} | {r['excluded']} |"
            )
        lines.append("")
    ct = crash_table(df)
    lines += [f"## Crashes by root cause ({len(ct)})", ""]
    if ct.empty:
        lines.append("None.")
    else:
        located = bool((ct["located_op"] != "").any() or (ct["located_modules"] != "").any())
        extra_h, extra_s = (" located op | modules |", "---|---|") if located else ("", "")
        lines += [f"| cause | entries | rows | failing op | error | message | statuses | examples |{extra_h}",
                  f"|---|---:|---:|---|---|---|---|---|{extra_s}"]
        for _, r in ct.iterrows():
            extra = f" {_md(r['located_op'])} | {_md(r['located_modules'])} |" if located else ""
            lines.append(
                f"| {r['cause'] or '?'} | {r['entries']} | {r['rows']} | {_md(r['failing_op'])} | {_md(r['error_type'])} | {_md(r['message'])} "
                f"| {r['statuses']} | {_md(r['examples'])} |{extra}"
            )
    nb = numerics_by_op(df)
    if not nb.empty and (nb["located_op"] != "").any():
        lines += ["", f"## Accuracy failures by located op ({len(nb)})", "",
                  "| entries | rows | located op | worst max rel | lowest cosine | modes | modules | examples |",
                  "|---:|---:|---|---:|---:|---|---|---|"]
        for _, r in nb.iterrows():
            lines.append(
                f"| {r['entries']} | {r['rows']} | {_md(r['located_op'] or '(not located)')} | {fmt_num(r['max_rel_err'])} "
                f"| {fmt_num(r['cosine'], 6, fixed=True)} | {r['modes']} | {_md(r['located_modules'])} "
                f"| {_md(r['examples'])} |"
            )
    verdicts = verdicts_markdown(df)
    if verdicts:
        lines += ["", verdicts.rstrip("\n")]
    causes = causes_markdown(df)  # each row that is no numerics proof, with its cause (harness/ci/causes.yaml)
    if causes:
        lines += ["", causes.rstrip("\n")]
    wn = worst_numerics(df, worst)
    lines += ["", f"## Worst numerics (top {len(wn)})", ""]
    if wn.empty:
        lines.append("None.")
    else:
        located = bool((wn["located_op"] != "").any() or (wn["located_module"] != "").any())
        lines += ["| entry | mode | status | max abs | max rel | cosine | rmse ratio |" + (" located op | module |" if located else ""),
                  "|---|---|---|---:|---:|---:|---:|" + ("---|---|" if located else "")]
        for _, r in wn.iterrows():
            lines.append(
                f"| `{r['entry_id']}` | {r['where']} | {r['status']} | {fmt_num(r['max_abs_err'])} "
                f"| {fmt_num(r['max_rel_err'])} | {fmt_num(r['cosine'], 6, fixed=True)} | {fmt_num(r['rmse_ratio'])} |"
                + (f" {_md(r['located_op'])} | {_md(r['located_module'])} |" if located else "")
            )
    lines += ["", performance.performance_markdown(df).rstrip("\n")]
    return "\n".join(lines) + "\n"


_md = md_cell  # older name, used by harness.sweep.outputs
