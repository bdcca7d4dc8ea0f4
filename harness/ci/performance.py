"""Performance figures of a results frame, per phase and mode, as TorchTPU's model harness states them per
model: first-step time (first_run_s), warmup overhead (warmup_s), post-warmup step time (run_s), peak memory
(peak_rss_mb: the worker's host RSS, the stand-in's device memory), end-to-end wall time (wall_s), and the
rows that compile again after warmup (recompiles, TorchTPU's PostWarmupRecompileError). Shared by
coverage.md and the dashboard. These are measurements: they never decide a status (schema.MEASUREMENTS)."""

from __future__ import annotations

import pandas as pd

from harness import schema
from harness.core.tables import fmt_num, md_cell

# (column, header) of the per-row figures, in TorchTPU's order
FIGURES = [("first_run_s", "first step s"), ("warmup_s", "warmup overhead s"), ("run_s", "step s"),
           ("peak_rss_mb", "peak RSS MiB"), ("wall_s", "wall s")]
SLOWEST = 20


def phase_of(df: pd.DataFrame) -> pd.Series:
    """The phase column ('' and absent: inference, as files before phases)."""
    if "phase" not in df.columns:
        return pd.Series("inference", index=df.index, dtype=object)
    return df["phase"].fillna("").astype(str).where(lambda s: s != "", "inference")


def where(df: pd.DataFrame) -> pd.Series:
    """'eager' for an inference row, 'train/eager' for a train row: one label for phase and mode."""
    return phase_of(df).map(lambda ph: "" if ph == "inference" else f"{ph}/") + df["mode"].astype(str)


def where_order(labels) -> list[str]:
    """Labels in schema order (inference modes, then train modes), unknown ones last."""
    order = [("" if ph == "inference" else f"{ph}/") + m for ph in schema.PHASES for m in schema.MODES]
    present = list(dict.fromkeys(labels))
    return [w for w in order if w in present] + [w for w in present if w not in order]


def _number(df: pd.DataFrame, col: str) -> pd.Series:
    """A numeric column, NaN where absent (frames of older schema versions, crafted frames)."""
    if col not in df.columns:
        return pd.Series(float("nan"), index=df.index)
    return pd.to_numeric(df[col], errors="coerce")


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that ran to the end (pass, fail_accuracy): a failed row's times are of a part of it."""
    return df[df["status"].isin(("pass", "fail_accuracy"))]


def _recompiles(df: pd.DataFrame) -> pd.Series:
    if "recompiles" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["recompiles"].fillna("").astype(str).str.startswith("recompiles")


def medians(df: pd.DataFrame) -> pd.DataFrame:
    """One row per phase/mode ('where'): rows that ran, the median of each figure, and how many recompile
    after warmup."""
    r = _measured(df).copy()
    r["where"] = where(r)
    out = []
    for w in where_order(r["where"]):
        g = r[r["where"] == w]
        rec = {"where": w, "rows": len(g), "recompiles": int(_recompiles(g).sum())}
        for col, _ in FIGURES:
            rec[col] = _number(g, col).median()
        out.append(rec)
    return pd.DataFrame(out, columns=["where", "rows", *[c for c, _ in FIGURES], "recompiles"])


def slowest(df: pd.DataFrame, n: int = SLOWEST) -> pd.DataFrame:
    """The n rows with the longest wall time (first step time for rows of schema < 7, which lack wall_s)."""
    r = df.copy()
    r["where"] = where(r)
    r["_key"] = _number(r, "wall_s").fillna(_number(r, "first_run_s"))
    r = r[r["_key"].notna()].sort_values(["_key", "entry_id", "where"], ascending=[False, True, True],
                                         kind="stable")
    r["recompiles"] = _recompiles(r).map({True: "recompiles", False: ""})
    cols = ["entry_id", "where", "status", *[c for c, _ in FIGURES], "warmup_steps", "recompiles"]
    for c in cols:
        if c not in r.columns:
            r[c] = float("nan")
    return r[cols].head(n).reset_index(drop=True)


def performance_markdown(df: pd.DataFrame, n: int = SLOWEST) -> str:
    """The performance section of coverage.md: medians per phase/mode and the n slowest rows."""

    def fmt(v) -> str:  # MiB and long runs as whole numbers, not 2.46e+03
        return f"{v:.0f}" if pd.notna(v) and abs(v) >= 1000 else fmt_num(v)
    med = medians(df)
    lines = ["## Performance", "",
             "TorchTPU's per-model figures, over the rows that ran to the end (pass, fail_accuracy): first step "
             "(first call), warmup overhead (warmup steps beyond as many steady ones; warm up until the compile "
             f"count is stable, at most 5), post-warmup step, peak host RSS of the worker, the row's wall time. "
             "`recompiles`: rows that compiled again after warmup. Measurements: they decide no status.", ""]
    if med.empty:
        return "\n".join([*lines, "No row ran to the end."]) + "\n"
    lines += ["| phase/mode | rows | " + " | ".join(f"median {h}" for _, h in FIGURES) + " | recompiles |",
              "|---|---:|" + "---:|" * len(FIGURES) + "---:|"]
    for _, r in med.iterrows():
        lines.append(f"| {r['where']} | {r['rows']} | " + " | ".join(fmt(r[c]) for c, _ in FIGURES)
                     + f" | {r['recompiles']} |")
    sl = slowest(df, n)
    lines += ["", f"### Slowest rows (top {len(sl)}, by wall time)", "",
              "| entry | phase/mode | status | " + " | ".join(h for _, h in FIGURES) + " | warmup steps | |",
              "|---|---|---|" + "---:|" * len(FIGURES) + "---:|---|"]
    for _, r in sl.iterrows():
        steps = "" if pd.isna(r["warmup_steps"]) else str(int(r["warmup_steps"]))
        lines.append(f"| `{r['entry_id']}` | {r['where']} | {r['status']} | "
                     + " | ".join(fmt(r[c]) for c, _ in FIGURES) + f" | {steps} | {md_cell(r['recompiles'])} |")
    return "\n".join(lines) + "\n"
