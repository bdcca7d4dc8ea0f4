"""`hf-tpu zoo list` and `hf-tpu zoo check`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from harness.zoo.entry import ZooEntry


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _add_selection(p: argparse.ArgumentParser, default_zoo: str) -> None:
    p.add_argument("--zoo", default=default_zoo,
                   help=f"smoke | full | path of a models-list CSV (default: {default_zoo})")
    p.add_argument("--library", choices=["transformers", "diffusers", "hub"], help="only this library")
    p.add_argument("--task", help="only this task family (e.g. causal-lm); see `zoo list --format tasks`")
    p.add_argument("--match", metavar="REGEX", help="only ids matching this regular expression")
    p.add_argument("--hub-layers", type=_positive_int, default=2,
                   help="cap num_hidden_layers of real hub configs (default: 2)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", metavar="{list,check}", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("list", help="list zoo entries (no model is built)")
    _add_selection(p, "full")
    p.add_argument("--format", choices=["table", "csv", "tasks"], default="table",
                   help="table (default), csv, or tasks (count per library and task family)")
    p = sub.add_parser("check", help="build entries and run them once on CPU, with a reason for each failure")
    _add_selection(p, "smoke")
    p.add_argument("--limit", type=_positive_int, help="only the first N selected entries")
    p.add_argument("--jobs", type=_non_negative_int, default=1,
                   help="worker processes (default: 1); 0 runs in this process, without crash/timeout isolation")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per entry before it counts as a timeout")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="CSV", help="write one row per entry to this CSV file")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-failure lines")


def _select(args: argparse.Namespace) -> list[ZooEntry]:
    from harness.zoo.zoo import load_zoo, select

    entries = load_zoo(args.zoo, hub_layers=args.hub_layers)
    if args.task is not None and args.task not in {e.task for e in entries}:
        raise ValueError(f"unknown task family {args.task!r}; known: {', '.join(sorted({e.task for e in entries}))}")
    return select(entries, library=args.library, task=args.task, match=args.match)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the zoo never downloads
    try:
        entries = _select(args)
    except ValueError as exc:
        print(f"hf-tpu zoo: error: {exc}", file=sys.stderr)
        return 2
    if args.zoo_command == "list":
        return _list(entries, args.format)
    return _check(entries[: args.limit] if args.limit else entries, args)


def _list(entries: list[ZooEntry], fmt: str) -> int:
    import pandas as pd

    df = pd.DataFrame([{"id": e.id, "library": e.library, "task": e.task, "model_type": e.model_type,
                        "model_class": e.model_class, "available": e.available, "reason": e.reason}
                       for e in entries], columns=["id", "library", "task", "model_type", "model_class",
                                                   "available", "reason"])
    if fmt == "csv":
        df.to_csv(sys.stdout, index=False)
    elif fmt == "tasks":
        counts = df.groupby(["library", "task"]).size().rename("entries").reset_index()
        print(counts.to_string(index=False))
        print(f"total: {len(df)} entries")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("id", "task", "available", box=None, pad_edge=False)
        for e in entries:
            table.add_row(e.id, e.task, "yes" if e.available else f"no: {e.reason}")
        Console(width=200).print(table)
        print(f"{len(entries)} entries")
    return 0


def _check(entries: list[ZooEntry], args: argparse.Namespace) -> int:
    import pandas as pd
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.zoo.check import RESULT_COLUMNS, CheckResult, run_check

    console = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    with Progress(TextColumn("zoo check"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=console, disable=args.quiet) as progress:
        bar = progress.add_task("check", total=len(entries), last="")

        def on_result(r: CheckResult) -> None:
            rows.append(vars(r))
            progress.update(bar, advance=1, last=r.id)
            if not r.ok and not args.quiet:
                progress.console.print(f"[red]FAIL[/red] {escape(r.id)} {escape(f'[{r.category}]')} "
                                       f"{escape(r.error[:160])}", highlight=False, soft_wrap=True)

        run_check(entries, jobs=args.jobs, timeout=args.timeout, seed=args.seed, on_result=on_result)
    df = pd.DataFrame(rows, columns=RESULT_COLUMNS).sort_values("id")
    if args.out:
        df.to_csv(args.out, index=False)
    print(summary_table(df))
    return 0


def summary_table(df: Any) -> str:
    """Count table per task family: entries, baseline passes, and failures by category."""
    import pandas as pd

    if df.empty:
        return "no entries selected"
    df = df.assign(result=df["category"].where(~df["ok"].astype(bool), "pass"))
    table = pd.crosstab([df["library"], df["task"]], df["result"], margins=True, margins_name="total")
    cols = ["pass"] + sorted(c for c in table.columns if c not in ("pass", "total")) + ["total"]
    table = table.reindex(columns=[c for c in cols if c in table.columns], fill_value=0)
    if "pass" not in table.columns:
        table.insert(0, "pass", 0)
    table["pass%"] = (100 * table["pass"] / table["total"]).round(1)
    return table.to_string()
