"""The static HTML dashboard: one self-contained page (inline CSS, SVG and JS; nothing from the network).

The last run by timestamp is the one shown in detail; all runs given make the trend. Charts are SVG drawn
here in Python so they render without JS; JS only filters and sorts the per-entry table. The filters can be
set from the URL hash (`dashboard.html#q=bert&status=crash&mode=eager`), so a filtered view can be linked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from harness import schema
from harness.ci import coverage as cov
from harness.ci import performance as perf
from harness.ci._io import atomic_write_text
from harness.ci.compare import load_comparison
from harness.ci.dashboard_charts import coverage_chart_svg, escape, trend_svg
from harness.ci.dashboard_sections import (comparison_html, entries_html, headline_html, html_table,
                                           performance_html, phase_cards_html, run_meta, upstream_html)
from harness.ci.runs import Run


DASHBOARD = "dashboard.html"

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


def order_runs(runs: Sequence[Run]) -> list[Run]:
    """Chronological by each run's latest row timestamp (runs without timestamps first, by name)."""
    return sorted(runs, key=lambda r: (r.timestamp, r.name))


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
        f'<tr data-run="{escape(p["name"])}"><td>{escape(p["name"])}</td><td>{escape(p["timestamp"])}</td>'
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
    crash = html_table(
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
    numerics = html_table(
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
<title>hf-tpu coverage · {escape(run.name)}</title><style>{_CSS}</style></head>
<body>
<header><h1>hf-tpu coverage</h1><p>{run_meta(run)}</p></header>
<main>
<section id="headline"><h2>Headline</h2>{headline_html(df)}{phase_cards_html(df)}{comparison_html(comp)}</section>
<section id="coverage"><h2>Coverage</h2><div class="grid">{"".join(charts)}</div></section>
<section id="trend"><h2>Trend over {len(ordered)} run{"s" if len(ordered) != 1 else ""}</h2>{trend}</section>
<section id="crashes"><h2>Run failures by root cause ({len(ct)} cause{"s" if len(ct) != 1 else ""})</h2>
<p class="note">Grouped by failing op, exception type and message with numbers, addresses and paths
normalised; sorted by entries affected.</p>{crash}</section>
<section id="numerics"><h2>Worst numerics</h2>
<p class="note">Rows that ran, fail_accuracy first, then by rmse ratio (rmse(fp64, tpu) / rmse(fp64, cpu)),
max relative error and cosine.</p>{numerics}</section>
{performance_html(df)}
{upstream_html(run.path)}
<section id="entries"><h2>All entries</h2>{entries_html(df, comp)}</section>
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
