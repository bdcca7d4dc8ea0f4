"""The dashboard's charts (dashboard.py), drawn as SVG in Python so they render without JS: statuses by mode,
and the trend of crash-free and numerics-match rates over runs; the status colours they share with the tables."""

from __future__ import annotations

import html

import pandas as pd

from harness import schema
from harness.ci import coverage as cov


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


def escape(s: object) -> str:
    return html.escape("" if s is None else str(s), quote=True)


# ---------------------------------------------------------------- charts (inline SVG)


def coverage_chart_svg(t: pd.DataFrame, col: str, chart_id: str) -> str:
    """Horizontal stacked bars: one per group, segments per status (share of the group's rows), and the
    two figures with denominators on the right. `t` is coverage.coverage_by(df, col)."""
    label_w, bar_w, right_w, row_h, top = 210, 430, 400, 26, 30
    width = label_w + bar_w + right_w
    height = top + row_h * max(len(t), 1) + 8
    parts = [
        f'<svg id="{escape(chart_id)}" class="chart coverage-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
    ]
    # Legend: only statuses that occur, so the chart explains itself.
    x = 40.0
    for s in schema.STATUSES:
        if s in t.columns and t[s].sum() > 0:
            parts.append(f'<rect x="{x:.1f}" y="6" width="11" height="11" fill="{STATUS_COLORS[s]}"/>')
            parts.append(f'<text x="{x + 15:.1f}" y="16" font-size="11" fill="#46505a">{escape(s)}</text>')
            x += 26 + 6.6 * len(s)
    for i, (_, r) in enumerate(t.iterrows()):
        y = top + i * row_h
        group = str(r[col])
        parts.append(
            f'<g class="bar" data-group="{escape(group)}" data-rows="{int(r["rows"])}" '
            f'data-crash-free="{int(r["crash_free"])}" data-denominator="{int(r["denominator"])}" '
            f'data-numerics-match="{int(r["numerics_match"])}" data-ran="{int(r["ran"])}">'
        )
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" font-size="12" text-anchor="end" fill="#1d2329">'
            f"{escape(group if len(group) <= 30 else group[:29] + '…')}</text>"
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
                f'height="{row_h - 8}" fill="{STATUS_COLORS[s]}"><title>{escape(group)}: {n} {s}</title></rect>'
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
                f'<circle class="trend-point" data-series="{key}" data-run="{escape(p["name"])}" '
                f'data-pct="{f.pct:.1f}" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{color}">'
                f"<title>{escape(p['name'])}: {label} {f}</title></circle>"
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
            f"{escape(label)}</text>"
        )
        if p["name"] != label:
            parts.append(
                f'<text x="{px(i):.1f}" y="{height - bottom + 32}" font-size="10" text-anchor="middle" '
                f'fill="#8a949e">{escape(p["name"][:24])}</text>'
            )
    lx = left
    for color, label in ((CRASH_FREE_COLOR, "crash-free %"), (NUMERICS_COLOR, "numerics-match %")):
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 9}" font-size="11" fill="#46505a">{label}</text>')
        lx += 140
    parts.append("</svg>")
    return "".join(parts)
