"""The dashboard's HTML sections (dashboard.py puts them on one page): the headline rates, the phase cards,
performance, the comparison with expected results, the per-entry table and upstream test results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import schema
from harness.ci import coverage as cov
from harness.ci import performance as perf
from harness.ci.compare import CLASSES
from harness.ci.dashboard_charts import STATUS_COLORS, escape
from harness.ci.runs import Run


def _status_badge(s: str) -> str:
    fg = "#1d2329" if s in ("fail_accuracy", "not_available", "skipped", "baseline_fail") else "#fff"
    return f'<span class="st" style="background:{STATUS_COLORS.get(s, "#777")};color:{fg}">{escape(s)}</span>'


# ---------------------------------------------------------------- page sections


def _td(v: object, kind: str) -> str:
    """One table cell; kind is text|num|cos|msg|status|cls|code (shared by every table on the page)."""
    if kind in ("num", "cos"):
        shown = cov.fmt_num(v, 6, fixed=True) if kind == "cos" else cov.fmt_num(v)
        return f'<td class="num" data-v="{escape("" if pd.isna(v) else v)}">{escape(shown)}</td>'
    if kind == "status":
        return f'<td data-v="{escape(v)}">{_status_badge(str(v))}</td>'
    if kind == "cls":
        return f'<td class="cls cls-{escape(v)}">{escape(v)}</td>'
    if kind == "code":
        return f"<td><code>{escape(v)}</code></td>" if v else "<td></td>"
    if kind == "msg":
        return f'<td class="msg">{escape(v)}</td>'
    return f"<td>{escape(v)}</td>"


def html_table(df: pd.DataFrame, cols: list[tuple[str, str, str]], table_id: str, empty: str) -> str:
    """cols: (column, header, kind) with kind in text|num|msg|status|code."""
    if df.empty:
        return f'<p class="note" id="{table_id}-empty">{escape(empty)}</p>'
    head = "".join(f'<th class="{"num" if k in ("num", "cos") else ""}">{escape(h)}</th>' for _, h, k in cols)
    body = []
    for _, r in df.iterrows():
        body.append("<tr>" + "".join(_td(r[c], k) for c, _, k in cols) + "</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def headline_html(df: pd.DataFrame) -> str:
    h = cov.headline(df)
    excl = ", ".join(schema.EXCLUDED_FROM_DENOMINATOR)
    return (
        '<div class="cards">'
        f'<div class="card crash" id="crash-free" data-num="{h.crash_free.num}" data-den="{h.crash_free.den}">'
        f'<div>Crash-free</div><div class="big">{cov.fmt_pct(h.crash_free.pct)}</div>'
        f'<div class="den">{h.crash_free.num} of {h.crash_free.den} rows ran without '
        f"{'/'.join(schema.RUN_FAILURES)}</div></div>"
        f'<div class="card numerics" id="numerics-match" data-num="{h.numerics_match.num}" '
        f'data-den="{h.numerics_match.den}">'
        f'<div>Numerics match</div><div class="big">{cov.fmt_pct(h.numerics_match.pct)}</div>'
        f'<div class="den">{h.numerics_match.num} of {h.numerics_match.den} rows that ran match the baseline</div>'
        "</div></div>"
        f'<p class="note">{h.rows} rows (entry × mode); {h.excluded} are left out of both denominators '
        f"({excl}: not the backend's doing).</p>"
    )


def phase_cards_html(df: pd.DataFrame) -> str:
    """With a train phase: each phase's two figures (a train row is not an inference row); '' otherwise."""
    phase = perf.phase_of(df)
    phases = [p for p in schema.PHASES if p in set(phase)]
    if phases == ["inference"] or not phases:
        return ""
    cards = []
    for ph in phases:
        h = cov.headline(df[phase == ph])
        for kind, fig, what in (("crash", h.crash_free, "crash-free"), ("numerics", h.numerics_match,
                                                                          "numerics-match")):
            cards.append(
                f'<div class="card {kind}" id="{what}-{ph}" data-num="{fig.num}" data-den="{fig.den}">'
                f'<div>{escape(ph.capitalize())}: {what}</div><div class="big">{cov.fmt_pct(fig.pct)}</div>'
                f'<div class="den">{fig.num} of {fig.den} {ph} rows</div></div>')
    return f'<div class="cards" id="phase-cards">{"".join(cards)}</div>'


def performance_html(df: pd.DataFrame, n: int = perf.SLOWEST) -> str:
    """TorchTPU's per-model figures: medians per phase/mode and the slowest rows (harness.ci.performance)."""
    figures = [(c, h, "num") for c, h in perf.FIGURES]
    med = html_table(perf.medians(df), [("where", "phase/mode", "text"), ("rows", "rows", "num"),
                                        *[(c, f"median {h}", k) for c, h, k in figures],
                                        ("recompiles", "recompile after warmup", "num")],
                     "perf-medians", "No row ran to the end.")
    slow = html_table(perf.slowest(df, n), [("entry_id", "entry", "code"), ("where", "phase/mode", "text"),
                                            ("status", "status", "status"), *figures,
                                            ("warmup_steps", "warmup steps", "num"), ("recompiles", "", "text")],
                      "perf-slowest", "No timed rows.")
    return ('<section id="performance"><h2>Performance</h2><p class="note">Per row, as TorchTPU\'s model harness '
            "states them: first step, warmup overhead (warm up until the compile count is stable, at most 5), "
            "post-warmup step, peak host RSS of the worker, wall time; rows that compile again after warmup are "
            f"flagged. Medians over the rows that ran to the end.</p>{med}<h3>Slowest rows (top {n})</h3>{slow}"
            "</section>")


def comparison_html(comp: pd.DataFrame | None) -> str:
    if comp is None:
        return ""
    vc = comp["class"].value_counts()
    items = " · ".join(
        f'<span class="cls cls-{c}" data-class="{c}" data-count="{int(vc.get(c, 0))}">{c} {int(vc.get(c, 0))}</span>'
        for c in CLASSES
    )
    return f'<p id="comparison-summary">Against the expected results: {items}</p>'


def entries_html(df: pd.DataFrame, comp: pd.DataFrame | None) -> str:
    d = df.copy()
    d["where"] = perf.where(d)  # 'eager', 'train/eager': the mode column and its filter name the phase too
    has_cls = comp is not None
    if has_cls:
        c = comp.assign(where=perf.where(comp))
        m = c.set_index(["entry_id", "where"])["class"]
        d["cls"] = [m.get((e, w), "") for e, w in zip(d["entry_id"], d["where"], strict=True)]
    d["error"] = [
        f"{t}: {msg}" if t and msg else (t or msg) for t, msg in zip(d["error_type"], d["error_message"], strict=True)
    ]
    d = d.sort_values(["entry_id", "where"], kind="stable")
    cols: list[tuple[str, str, str]] = [
        ("entry_id", "entry", "code"),
        ("library", "library", "text"),
        ("task", "task", "text"),
        ("where", "mode", "text"),
        ("status", "status", "status"),
    ]
    if has_cls:
        cols.append(("cls", "vs expected", "cls"))
    cols += [
        ("error", "error", "msg"),
        ("failing_op", "failing op", "code"),
        ("max_abs_err", "max abs err", "num"),
        ("max_rel_err", "max rel err", "num"),
        ("cosine", "cosine", "cos"),
        ("rmse_ratio", "rmse ratio", "num"),
        ("compile_s", "compile s", "num"),
        ("first_run_s", "first step s", "num"),
        ("warmup_s", "warmup overhead s", "num"),
        ("run_s", "step s", "num"),
        ("peak_rss_mb", "peak RSS MiB", "num"),
        ("wall_s", "wall s", "num"),
        ("recompiles", "recompiles", "msg"),
        ("failed_at", "failed at", "text"),
        ("graph_breaks", "graph breaks", "num"),
        ("fallback_ops", "fallback ops", "msg"),
    ]
    head = "".join(f'<th class="{"num" if k in ("num", "cos") else ""}">{escape(h)}</th>' for _, h, k in cols)
    body = []
    for _, r in d.iterrows():
        text = " ".join(str(r[c]) for c in ("entry_id", "library", "task", "model_type", "model_class", "mode",
                                           "status", "error", "failing_op", "fallback_ops")).lower()
        tds = [_td(r[c], k) for c, _, k in cols]
        body.append(
            f'<tr data-status="{escape(r["status"])}" data-mode="{escape(r["where"])}" '
            f'data-cls="{escape(r["cls"]) if has_cls else ""}" data-text="{escape(text)}">' + "".join(tds) + "</tr>"
        )
    present = [s for s in schema.STATUSES if s in set(d["status"])]
    status_opts = (
        '<option value="">any status</option><option value="@not_pass">not pass</option>'
        '<option value="@run_failure">any run failure</option>'
        + "".join(f'<option value="{s}">{s}</option>' for s in present)
    )
    mode_opts = '<option value="">any mode</option>' + "".join(
        f'<option value="{w}">{w}</option>' for w in perf.where_order(d["where"])
    )
    cls_sel = ""
    if has_cls:
        cls_sel = '<select id="filter-class" aria-label="comparison class"><option value="">any class</option>' + "".join(
            f'<option value="{c}">{c}</option>' for c in CLASSES
        ) + "</select>"
    return (
        '<div class="filters">'
        '<input id="filter-text" type="search" placeholder="filter: entry, task, error, op…" aria-label="text filter">'
        f'<select id="filter-status" aria-label="status">{status_opts}</select>'
        f'<select id="filter-mode" aria-label="mode">{mode_opts}</select>{cls_sel}'
        f'<span id="entries-count" class="note">showing {len(d)} of {len(d)} rows</span></div>'
        f'<div class="scroll"><table id="entries-table"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div>'
    )


def run_meta(run: Run) -> str:
    df = run.df

    def uniq(c: str) -> str:
        v = sorted({x for x in df[c] if x}) if c in df else []
        return ", ".join(v) if v else "?"

    return (
        f"run <b>{escape(run.name)}</b> · finished {escape(run.timestamp or '?')} · backend {escape(uniq('backend'))} · "
        f"precision {escape(uniq('precision'))} · dtype {escape(uniq('dtype'))} · {escape(uniq('versions'))}"
    )


def upstream_html(run_dir: Path) -> str:
    """The section for `hf-tpu upstream-tests` results in the run (upstream.csv, or upstream/upstream.csv as
    the nightly lays it out); '' when there are none."""
    from harness.upstream import table as up

    path = next((p for p in (run_dir / "upstream.csv", run_dir / "upstream" / "upstream.csv") if p.is_file()), None)
    if path is None:
        return ""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    causes = up.causes(df)
    fams = "".join(f"<tr><td>{escape(f)}</td><td class=\"num\">{escape(up.share(df[df['family'] == f]))}</td></tr>"
                   for f in sorted(df["family"].unique()))
    body = html_table(causes, [("tests", "tests", "num"), ("failing_op", "failing op", "code"),
                               ("error_type", "error type", "text"), ("message", "normalised message", "msg"),
                               ("outcomes", "tpu outcomes", "text"), ("examples", "examples", "msg")],
                      "upstream-table", "No test that passes on CPU fails on tpu.")
    return (f'<section id="upstream"><h2>Transformers\' own model tests on tpu</h2>'
            f'<p>CPU-passing tests that pass on tpu: <b id="upstream-share">{escape(up.share(df))}</b> '
            f'({len(df)} tests; <code>{escape(path.name)}</code>)</p>'
            f'<table id="upstream-families"><thead><tr><th>family</th><th class="num">pass on tpu / pass on cpu'
            f'</th></tr></thead><tbody>{fams}</tbody></table>'
            f'<h3>CPU-pass, tpu-fail tests by root cause ({len(causes)})</h3>{body}</section>')
