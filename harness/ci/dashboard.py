"""The static HTML dashboard: one self-contained page (inline CSS, SVG and JS; nothing from the network).

The last run by timestamp is the one shown in detail; all runs given make the trend. Charts are SVG drawn
here in Python so they render without JS; JS only filters and sorts the per-entry table. The filters can be
set from the URL hash (`dashboard.html#q=bert&status=crash&mode=eager`), so a filtered view can be linked.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness import schema
from harness.ci import coverage as cov
from harness.ci import performance as perf
from harness.ci._io import atomic_write_text
from harness.ci.compare import CLASSES, load_comparison
from harness.ci.runs import Run

DASHBOARD = "dashboard.html"

# Greens for good, amber for wrong numbers, reds/purples for run failures, greys for not counted.
STATUS_COLORS = {
    "pass": "#2e7d32",
    "fail_accuracy": "#f9a825",
    "fail_to_run": "#e53935",
    "compile_fail": "#d81b60",
    "timeout": "#8e24aa",
    "oom": "#5e35b1",
    "crash": "#b71c1c",
    "baseline_fail": "#90a4ae",
    "not_available": "#b0bec5",
    "skipped": "#dfe4e7",
}
CRASH_FREE_COLOR = "#1565c0"
NUMERICS_COLOR = "#2e7d32"

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:16px 28px}
header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c6ccd2;font-size:13px}
main{padding:16px 28px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e5;border-radius:6px;padding:14px 18px;margin:0 0 16px}
h2{font-size:17px;margin:0 0 10px}
h3{font-size:14px;margin:12px 0 6px;color:#46505a}
.cards{display:flex;gap:16px;flex-wrap:wrap}
.card{flex:1 1 260px;border:1px solid #dde1e5;border-radius:6px;padding:12px 16px}
.card .big{font-size:40px;font-weight:700;line-height:1.1}
.card .den{color:#46505a}
.card.crash .big{color:#1565c0}.card.numerics .big{color:#2e7d32}
.note{color:#5f6b76;font-size:12.5px}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{border-bottom:1px solid #e6e9ec;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f0f2f4;position:sticky;top:0;cursor:pointer;user-select:none;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.msg{min-width:220px;max-width:420px;overflow-wrap:break-word}
.st{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:11.5px;white-space:nowrap}
.cls{font-weight:600}.cls-FAIL,.cls-MISSING{color:#b71c1c}.cls-IMPROVED,.cls-NEW{color:#1565c0}.cls-FLAKY{color:#8e24aa}
.filters{display:flex;gap:10px;align-items:center;margin:0 0 8px;flex-wrap:wrap}
.filters input{padding:4px 8px;width:280px}
.scroll{max-height:640px;overflow:auto;border:1px solid #e6e9ec}
svg text{font-family:system-ui,sans-serif}
svg.chart{max-width:100%;height:auto}
.grid{display:grid;grid-template-columns:1fr;gap:8px}
"""

# Filters and sorts the per-entry table; nothing else needs JS.
_JS = r"""
(function(){
  const table=document.getElementById('entries-table'); if(!table) return;
  const rows=Array.from(table.tBodies[0].rows);
  const q=document.getElementById('filter-text'), st=document.getElementById('filter-status'),
        md=document.getElementById('filter-mode'), cl=document.getElementById('filter-class'),
        count=document.getElementById('entries-count');
  const RUN_FAILURES=%RUN_FAILURES%;
  function statusOk(s,want){
    if(!want) return true;
    if(want==='@run_failure') return RUN_FAILURES.includes(s);
    if(want==='@not_pass') return s!=='pass';
    return s===want;
  }
  function apply(){
    const t=q.value.trim().toLowerCase(); let n=0;
    for(const tr of rows){
      const ok=(!t||tr.dataset.text.includes(t))&&statusOk(tr.dataset.status,st.value)
        &&(!md.value||tr.dataset.mode===md.value)&&(!cl||!cl.value||tr.dataset.cls===cl.value);
      tr.hidden=!ok; if(ok) n++;
    }
    count.textContent='showing '+n+' of '+rows.length+' rows';
    count.dataset.shown=n;
    const h=new URLSearchParams();
    if(t) h.set('q',t); if(st.value) h.set('status',st.value); if(md.value) h.set('mode',md.value);
    if(cl&&cl.value) h.set('class',cl.value);
    const s=h.toString(); history.replaceState(null,'',s?'#'+s:location.pathname+location.search);
  }
  const init=new URLSearchParams(location.hash.slice(1));
  if(init.get('q')) q.value=init.get('q');
  for(const [el,k] of [[st,'status'],[md,'mode'],[cl,'class']]){
    if(el&&init.get(k)&&Array.from(el.options).some(o=>o.value===init.get(k))) el.value=init.get(k);
  }
  for(const el of [q,st,md,cl]) if(el) el.addEventListener(el===q?'input':'change',apply);
  // Click a header to sort by it; numeric columns sort numerically, empty cells last.
  Array.from(table.tHead.rows[0].cells).forEach((th,i)=>th.addEventListener('click',()=>{
    const dir=th.dataset.dir==='asc'?'desc':'asc'; th.dataset.dir=dir; const num=th.classList.contains('num');
    const key=tr=>{const v=tr.cells[i].dataset.v??tr.cells[i].textContent; return num?(v===''?NaN:parseFloat(v)):v;};
    rows.sort((a,b)=>{const x=key(a),y=key(b);
      if(num){if(isNaN(x))return 1; if(isNaN(y))return -1; return dir==='asc'?x-y:y-x;}
      return dir==='asc'?String(x).localeCompare(y):String(y).localeCompare(x);});
    for(const tr of rows) table.tBodies[0].appendChild(tr);
  }));
  apply();
})();
// Record laid-out sizes in the DOM, so a headless-browser test can see the charts really rendered.
for(const s of document.querySelectorAll('svg.chart')){
  const b=s.getBoundingClientRect(); s.dataset.renderedWidth=Math.round(b.width); s.dataset.renderedHeight=Math.round(b.height);
}
for(const r of document.querySelectorAll('rect.seg')) r.dataset.renderedWidth=r.getBoundingClientRect().width.toFixed(1);
document.body.dataset.js='ready';
"""


def _e(s: object) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def _status_badge(s: str) -> str:
    fg = "#1d2329" if s in ("fail_accuracy", "not_available", "skipped", "baseline_fail") else "#fff"
    return f'<span class="st" style="background:{STATUS_COLORS.get(s, "#777")};color:{fg}">{_e(s)}</span>'


def order_runs(runs: Sequence[Run]) -> list[Run]:
    """Chronological by each run's latest row timestamp (runs without timestamps first, by name)."""
    return sorted(runs, key=lambda r: (r.timestamp, r.name))


# ---------------------------------------------------------------- charts (inline SVG)


def coverage_chart_svg(t: pd.DataFrame, col: str, chart_id: str) -> str:
    """Horizontal stacked bars: one per group, segments per status (share of the group's rows), and the
    two figures with denominators on the right. `t` is coverage.coverage_by(df, col)."""
    label_w, bar_w, right_w, row_h, top = 210, 430, 400, 26, 30
    width = label_w + bar_w + right_w
    height = top + row_h * max(len(t), 1) + 8
    parts = [
        f'<svg id="{_e(chart_id)}" class="chart coverage-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
    ]
    # Legend: only statuses that occur, so the chart explains itself.
    x = 40.0
    for s in schema.STATUSES:
        if s in t.columns and t[s].sum() > 0:
            parts.append(f'<rect x="{x:.1f}" y="6" width="11" height="11" fill="{STATUS_COLORS[s]}"/>')
            parts.append(f'<text x="{x + 15:.1f}" y="16" font-size="11" fill="#46505a">{_e(s)}</text>')
            x += 26 + 6.6 * len(s)
    for i, (_, r) in enumerate(t.iterrows()):
        y = top + i * row_h
        group = str(r[col])
        parts.append(
            f'<g class="bar" data-group="{_e(group)}" data-rows="{int(r["rows"])}" '
            f'data-crash-free="{int(r["crash_free"])}" data-denominator="{int(r["denominator"])}" '
            f'data-numerics-match="{int(r["numerics_match"])}" data-ran="{int(r["ran"])}">'
        )
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" font-size="12" text-anchor="end" fill="#1d2329">'
            f"{_e(group if len(group) <= 30 else group[:29] + '…')}</text>"
        )
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{bar_w}" height="{row_h - 8}" fill="#f0f2f4"/>')
        x0 = float(label_w)
        total = max(int(r["rows"]), 1)
        for s in schema.STATUSES:
            n = int(r[s])
            if not n:
                continue
            w = bar_w * n / total
            parts.append(
                f'<rect class="seg" data-status="{s}" data-count="{n}" x="{x0:.2f}" y="{y + 3}" width="{w:.2f}" '
                f'height="{row_h - 8}" fill="{STATUS_COLORS[s]}"><title>{_e(group)}: {n} {s}</title></rect>'
            )
            x0 += w
        cf = cov.Figure(int(r["crash_free"]), int(r["denominator"]))
        nm = cov.Figure(int(r["numerics_match"]), int(r["ran"]))
        parts.append(
            f'<text x="{label_w + bar_w + 10}" y="{y + 16}" font-size="12" fill="#1d2329">'
            f'<tspan fill="{CRASH_FREE_COLOR}" font-weight="600">crash-free {cf}</tspan>'
            f'<tspan dx="10" fill="{NUMERICS_COLOR}" font-weight="600">numerics {nm}</tspan></text>'
        )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def trend_svg(points: list[dict]) -> str:
    """Crash-free % and numerics-match % per run, in run order; each point carries its fraction."""
    width, height, left, right, top, bottom = 900, 260, 48, 20, 20, 58
    pad = 50  # keeps the first and last points and their labels clear of the axis and the edge
    pw, ph = width - left - right, height - top - bottom
    n = len(points)

    def px(i: int) -> float:
        return left + (pw / 2 if n == 1 else pad + (pw - 2 * pad) * i / (n - 1))

    def py(pct: float) -> float:
        return top + ph * (1 - pct / 100.0)

    parts = [
        f'<svg id="trend-chart" class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
    ]
    for g in (0, 25, 50, 75, 100):
        y = py(g)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e9ec"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#5f6b76">{g}%</text>')
    for key, color, label in (
        ("crash_free", CRASH_FREE_COLOR, "crash-free"),
        ("numerics_match", NUMERICS_COLOR, "numerics-match"),
    ):
        pts = [(px(i), py(p[key].pct)) for i, p in enumerate(points) if p[key].pct is not None]
        if len(pts) > 1:
            parts.append(
                f'<polyline class="trend-line" data-series="{key}" fill="none" stroke="{color}" stroke-width="2.5" '
                f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>'
            )
        for i, p in enumerate(points):
            f = p[key]
            if f.pct is None:
                continue
            x, y = px(i), py(f.pct)
            parts.append(
                f'<circle class="trend-point" data-series="{key}" data-run="{_e(p["name"])}" '
                f'data-pct="{f.pct:.1f}" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{color}">'
                f"<title>{_e(p['name'])}: {label} {f}</title></circle>"
            )
            # The higher of the two series is labelled above its point, the lower below, so labels never meet.
            other = p["numerics_match" if key == "crash_free" else "crash_free"].pct
            above = other is None or f.pct > other or (f.pct == other and key == "crash_free")
            dy = -9 if above else 17
            parts.append(
                f'<text x="{x:.1f}" y="{y + dy:.1f}" font-size="11" text-anchor="middle" fill="{color}">'
                f"{cov.fmt_pct(f.pct)}</text>"
            )
    for i, p in enumerate(points):
        label = p["timestamp"][:10] or p["name"]
        parts.append(
            f'<text x="{px(i):.1f}" y="{height - bottom + 18}" font-size="11" text-anchor="middle" fill="#46505a">'
            f"{_e(label)}</text>"
        )
        if p["name"] != label:
            parts.append(
                f'<text x="{px(i):.1f}" y="{height - bottom + 32}" font-size="10" text-anchor="middle" '
                f'fill="#8a949e">{_e(p["name"][:24])}</text>'
            )
    lx = left
    for color, label in ((CRASH_FREE_COLOR, "crash-free %"), (NUMERICS_COLOR, "numerics-match %")):
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 9}" font-size="11" fill="#46505a">{label}</text>')
        lx += 140
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- page sections


def _td(v: object, kind: str) -> str:
    """One table cell; kind is text|num|cos|msg|status|cls|code (shared by every table on the page)."""
    if kind in ("num", "cos"):
        shown = cov.fmt_num(v, 6, fixed=True) if kind == "cos" else cov.fmt_num(v)
        return f'<td class="num" data-v="{_e("" if pd.isna(v) else v)}">{_e(shown)}</td>'
    if kind == "status":
        return f'<td data-v="{_e(v)}">{_status_badge(str(v))}</td>'
    if kind == "cls":
        return f'<td class="cls cls-{_e(v)}">{_e(v)}</td>'
    if kind == "code":
        return f"<td><code>{_e(v)}</code></td>" if v else "<td></td>"
    if kind == "msg":
        return f'<td class="msg">{_e(v)}</td>'
    return f"<td>{_e(v)}</td>"


def _table(df: pd.DataFrame, cols: list[tuple[str, str, str]], table_id: str, empty: str) -> str:
    """cols: (column, header, kind) with kind in text|num|msg|status|code."""
    if df.empty:
        return f'<p class="note" id="{table_id}-empty">{_e(empty)}</p>'
    head = "".join(f'<th class="{"num" if k in ("num", "cos") else ""}">{_e(h)}</th>' for _, h, k in cols)
    body = []
    for _, r in df.iterrows():
        body.append("<tr>" + "".join(_td(r[c], k) for c, _, k in cols) + "</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _headline_html(df: pd.DataFrame) -> str:
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


def _phase_cards_html(df: pd.DataFrame) -> str:
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
                f'<div>{_e(ph.capitalize())}: {what}</div><div class="big">{cov.fmt_pct(fig.pct)}</div>'
                f'<div class="den">{fig.num} of {fig.den} {ph} rows</div></div>')
    return f'<div class="cards" id="phase-cards">{"".join(cards)}</div>'


def _performance_html(df: pd.DataFrame, n: int = perf.SLOWEST) -> str:
    """TorchTPU's per-model figures: medians per phase/mode and the slowest rows (harness.ci.performance)."""
    figures = [(c, h, "num") for c, h in perf.FIGURES]
    med = _table(perf.medians(df), [("where", "phase/mode", "text"), ("rows", "rows", "num"),
                                    *[(c, f"median {h}", k) for c, h, k in figures],
                                    ("recompiles", "recompile after warmup", "num")],
                 "perf-medians", "No row ran to the end.")
    slow = _table(perf.slowest(df, n), [("entry_id", "entry", "code"), ("where", "phase/mode", "text"),
                                        ("status", "status", "status"), *figures,
                                        ("warmup_steps", "warmup steps", "num"), ("recompiles", "", "text")],
                  "perf-slowest", "No timed rows.")
    return ('<section id="performance"><h2>Performance</h2><p class="note">Per row, as TorchTPU\'s model harness '
            "states them: first step, warmup overhead (warm up until the compile count is stable, at most 5), "
            "post-warmup step, peak host RSS of the worker, wall time; rows that compile again after warmup are "
            f"flagged. Medians over the rows that ran to the end.</p>{med}<h3>Slowest rows (top {n})</h3>{slow}"
            "</section>")


def _comparison_html(comp: pd.DataFrame | None) -> str:
    if comp is None:
        return ""
    vc = comp["class"].value_counts()
    items = " · ".join(
        f'<span class="cls cls-{c}" data-class="{c}" data-count="{int(vc.get(c, 0))}">{c} {int(vc.get(c, 0))}</span>'
        for c in CLASSES
    )
    return f'<p id="comparison-summary">Against the expected results: {items}</p>'


def _entries_html(df: pd.DataFrame, comp: pd.DataFrame | None) -> str:
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
    head = "".join(f'<th class="{"num" if k in ("num", "cos") else ""}">{_e(h)}</th>' for _, h, k in cols)
    body = []
    for _, r in d.iterrows():
        text = " ".join(str(r[c]) for c in ("entry_id", "library", "task", "model_type", "model_class", "mode",
                                           "status", "error", "failing_op", "fallback_ops")).lower()
        tds = [_td(r[c], k) for c, _, k in cols]
        body.append(
            f'<tr data-status="{_e(r["status"])}" data-mode="{_e(r["where"])}" '
            f'data-cls="{_e(r["cls"]) if has_cls else ""}" data-text="{_e(text)}">' + "".join(tds) + "</tr>"
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


def _run_meta(run: Run) -> str:
    df = run.df

    def uniq(c: str) -> str:
        v = sorted({x for x in df[c] if x}) if c in df else []
        return ", ".join(v) if v else "?"

    return (
        f"run <b>{_e(run.name)}</b> · finished {_e(run.timestamp or '?')} · backend {_e(uniq('backend'))} · "
        f"precision {_e(uniq('precision'))} · dtype {_e(uniq('dtype'))} · {_e(uniq('versions'))}"
    )


def _upstream_html(run_dir: Path) -> str:
    """The section for `hf-tpu upstream-tests` results in the run (upstream.csv, or upstream/upstream.csv as
    the nightly lays it out); '' when there are none."""
    from harness.upstream import table as up

    path = next((p for p in (run_dir / "upstream.csv", run_dir / "upstream" / "upstream.csv") if p.is_file()), None)
    if path is None:
        return ""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    causes = up.causes(df)
    fams = "".join(f"<tr><td>{_e(f)}</td><td class=\"num\">{_e(up.share(df[df['family'] == f]))}</td></tr>"
                   for f in sorted(df["family"].unique()))
    body = _table(causes, [("tests", "tests", "num"), ("failing_op", "failing op", "code"),
                           ("error_type", "error type", "text"), ("message", "normalised message", "msg"),
                           ("outcomes", "tpu outcomes", "text"), ("examples", "examples", "msg")],
                  "upstream-table", "No test that passes on CPU fails on tpu.")
    return (f'<section id="upstream"><h2>Transformers\' own model tests on tpu</h2>'
            f'<p>CPU-passing tests that pass on tpu: <b id="upstream-share">{_e(up.share(df))}</b> '
            f'({len(df)} tests; <code>{_e(path.name)}</code>)</p>'
            f'<table id="upstream-families"><thead><tr><th>family</th><th class="num">pass on tpu / pass on cpu'
            f'</th></tr></thead><tbody>{fams}</tbody></table>'
            f'<h3>CPU-pass, tpu-fail tests by root cause ({len(causes)})</h3>{body}</section>')


def render_dashboard(runs: Sequence[Run], worst: int = 20) -> str:
    """The whole page for `runs` (at least one); the latest by timestamp is shown in detail."""
    if not runs:
        raise ValueError("render_dashboard needs at least one run")
    ordered = order_runs(runs)
    run = ordered[-1]
    df = run.df
    comp = load_comparison(run.path)

    charts = []
    t = cov.coverage_by(df.assign(mode=perf.where(df)), "mode")  # 'train/eager' beside 'eager'
    charts.append("<h3>By mode</h3>" + coverage_chart_svg(
        t.set_index("mode").loc[perf.where_order(t["mode"])].reset_index(), "mode", "chart-mode"))
    phase = perf.phase_of(df)
    for col, title in (("task", "task family"), ("library", "library")):
        for ph in [p for p in schema.PHASES if p in set(phase)]:
            suffix = "" if ph == "inference" else f"-{ph}"  # the inference charts keep their ids
            label = "" if set(phase) == {"inference"} else f" ({ph})"
            t = cov.coverage_by(df[phase == ph], col)
            charts.append(f"<h3>By {title}{label}</h3>" + coverage_chart_svg(t, col, f"chart-{col}{suffix}"))

    points = []
    for r in ordered:
        h = cov.headline(r.df)
        points.append(
            {"name": r.name, "timestamp": r.timestamp, "crash_free": h.crash_free,
             "numerics_match": h.numerics_match, "rows": h.rows}
        )
    trend_rows = "".join(
        f'<tr data-run="{_e(p["name"])}"><td>{_e(p["name"])}</td><td>{_e(p["timestamp"])}</td>'
        f'<td class="num">{p["crash_free"]}</td><td class="num">{p["numerics_match"]}</td>'
        f'<td class="num">{p["rows"]}</td></tr>'
        for p in points
    )
    trend = (
        trend_svg(points)
        + '<table id="trend-table"><thead><tr><th>run</th><th>finished</th><th class="num">crash-free</th>'
        f'<th class="num">numerics-match</th><th class="num">rows</th></tr></thead><tbody>{trend_rows}</tbody></table>'
    )

    ct = cov.crash_table(df)
    crash = _table(
        ct,
        [
            ("entries", "entries", "num"),
            ("rows", "rows", "num"),
            ("failing_op", "failing op", "code"),
            ("error_type", "error type", "text"),
            ("message", "normalised message", "msg"),
            ("statuses", "statuses", "text"),
            ("modes", "modes", "text"),
            ("examples", "examples", "msg"),
        ],
        "crash-table",
        "No run failures.",
    )
    wn = cov.worst_numerics(df, worst)
    numerics = _table(
        wn,
        [
            ("entry_id", "entry", "code"),
            ("where", "mode", "text"),
            ("task", "task", "text"),
            ("status", "status", "status"),
            ("dtype", "dtype", "text"),
            ("max_abs_err", "max abs err", "num"),
            ("max_rel_err", "max rel err", "num"),
            ("cosine", "cosine", "cos"),
            ("rmse_ratio", "rmse ratio", "num"),
        ],
        "numerics-table",
        "No rows with numerics (nothing ran).",
    )
    js = _JS.replace("%RUN_FAILURES%", json.dumps(list(schema.RUN_FAILURES)))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>hf-tpu coverage · {_e(run.name)}</title><style>{_CSS}</style></head>
<body>
<header><h1>hf-tpu coverage</h1><p>{_run_meta(run)}</p></header>
<main>
<section id="headline"><h2>Headline</h2>{_headline_html(df)}{_phase_cards_html(df)}{_comparison_html(comp)}</section>
<section id="coverage"><h2>Coverage</h2><div class="grid">{"".join(charts)}</div></section>
<section id="trend"><h2>Trend over {len(ordered)} run{"s" if len(ordered) != 1 else ""}</h2>{trend}</section>
<section id="crashes"><h2>Run failures by root cause ({len(ct)} cause{"s" if len(ct) != 1 else ""})</h2>
<p class="note">Grouped by failing op, exception type and message with numbers, addresses and paths
normalised; sorted by entries affected.</p>{crash}</section>
<section id="numerics"><h2>Worst numerics</h2>
<p class="note">Rows that ran, fail_accuracy first, then by rmse ratio (rmse(fp64, tpu) / rmse(fp64, cpu)),
max relative error and cosine.</p>{numerics}</section>
{_performance_html(df)}
{_upstream_html(run.path)}
<section id="entries"><h2>All entries</h2>{_entries_html(df, comp)}</section>
</main>
<script>{js}</script>
</body></html>
"""


def default_output(runs: Sequence[Run]) -> Path:
    return order_runs(runs)[-1].path / DASHBOARD


def write_dashboard(runs: Sequence[Run], out: str | Path | None = None, worst: int = 20) -> Path:
    """Render and write the page; default location is the latest run's dashboard.html."""
    p = Path(out) if out else default_output(runs)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, render_dashboard(runs, worst=worst))
    return p
