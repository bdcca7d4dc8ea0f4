"""Show a Diagnosis: a rich panel on the terminal, `diagnosis.json` and `diagnosis.md` next to the repro."""

from __future__ import annotations

import json
from pathlib import Path

from harness.sweep.results import atomic_write


def _fmt(x) -> str:
    if x is None:
        return ""
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def _lines(d) -> list[tuple[str, str]]:
    phase = getattr(d, "phase", "inference")
    rows = [("entry", d.entry_id), ("mode", d.mode if phase == "inference" else f"{d.mode}, train phase"),
            ("status", d.status), ("found", d.summary)]
    if getattr(d, "located_tensor", ""):
        rows.append(("diverges first", f"step {d.located_step}: {d.located_tensor}"))
    if getattr(d, "located_parameter", ""):
        rows.append(("parameter", f"{d.located_parameter} (first diverging tensor's parameter)"))
    if d.located_module or d.located_op:
        rows.append(("module", (d.located_module or "<model>") + (f" ({d.module_class})" if d.module_class else "")))
    if d.located_op:
        rows.append(("op", d.located_op + (f" (raised inside {d.outer_op})" if d.outer_op else "")))
    if d.op_inputs:
        rows.append(("op inputs", ", ".join(d.op_inputs)))
    if d.op_kwargs:
        rows.append(("op kwargs", ", ".join(f"{k}={v}" for k, v in d.op_kwargs.items())))
    if d.error_type:
        rows.append(("error", f"{d.error_type}: {d.error_message}"))
    for diffs, what in ((d.op_diffs, "op output"), (d.module_diffs, "module output"), (d.output_diffs, "model output")):
        for x in diffs[:3]:
            if x.get("max_abs_err") is None:
                rows.append((what, x.get("reason") or x["name"]))
                continue
            rows.append((what, f"{x['name']}: max abs err {_fmt(x.get('max_abs_err'))}, max rel err "
                               f"{_fmt(x.get('max_rel_err'))}, cosine {_fmt(x.get('cosine'))}"))
        if diffs:
            break
    if d.graph_breaks:
        rows.append(("graph breaks", "; ".join(d.graph_breaks[:3])))
    if d.downstream:
        rows.append(("earlier, downstream", ", ".join(d.downstream[:5])))
    for n in d.notes:
        rows.append(("note", n))
    rows.append(("tolerance", f"{d.tol:g} (precision {d.precision}, dtype {d.dtype}; harness/sweep/numerics.py)"))
    if d.repro_path:
        rows.append(("repro", f"python {d.repro_path}"))
    if d.report_path:
        rows.append(("report", d.report_path))
    rows.append(("time", f"{d.seconds:g} s"))
    return rows


def markdown(d) -> str:
    phase = "" if getattr(d, "phase", "inference") == "inference" else ", train"
    out = [f"# Diagnosis: `{d.entry_id}` ({d.mode}{phase})", "", "| | |", "|---|---|"]
    for k, v in _lines(d):
        out.append(f"| {k} | {str(v).replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"


def write_reports(d, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "diagnosis.json"
    d.report_path = str(path)
    atomic_write(path, json.dumps(d.to_json(), indent=2, default=str).encode())
    atomic_write(out_dir / "diagnosis.md", markdown(d).encode())
    return path


def show(d, console=None) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = console or Console()
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in _lines(d):
        t.add_row(k, str(v))
    color = {"pass": "green", "fail_accuracy": "yellow"}.get(d.status, "red")
    console.print(Panel(t, title=f"hf-tpu diagnose: [bold]{d.status}[/bold]", title_align="left", border_style=color))
