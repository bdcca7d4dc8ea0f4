"""`hf-tpu compare RUN`: classify each (entry, phase, mode) against reports/expected/ (rules in harness.ci.compare)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import schema
from harness.ci import expected as exp_mod
from harness.ci.cli_common import guarded
from harness.ci.compare import CLASSES, Comparison, where_label, compare, write_comparison
from harness.ci.runs import load_run
from harness.ci.scope import run_phases, run_scope

_STYLE = {"FAIL": "bold red", "MISSING": "red", "IMPROVED": "cyan", "NEW": "cyan", "FLAKY": "magenta", "PASS": "green"}
SHOW_LIMIT = 60  # differences printed to the terminal; the full list is in comparison.csv/md


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory holding results.csv (e.g. reports/<run-id>)")
    parser.add_argument(
        "--expected", metavar="DIR", default=str(exp_mod.DEFAULT_DIR),
        help="expected-results directory (default: %(default)s)",
    )
    parser.add_argument(
        "--accept-improvements", action="store_true",
        help="exit 0 even if entries IMPROVED or are NEW (the expected files are then out of date)",
    )
    parser.add_argument(
        "--allow-missing", action="store_true",
        help="exit 0 even if expected entries are MISSING from the run (for runs of part of the zoo)",
    )
    parser.add_argument("--no-write", action="store_true", help="do not write comparison.csv/.md into RUN")
    parser.add_argument(
        "--whole-zoo", action="store_true",
        help="hold the run to every expected entry, not only those its selection (run.json: zoo, shard, "
             "--match, ...) covers",
    )


def _print(comp: Comparison, run_name: str, expected_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"{run_name} vs {expected_dir}")
    t.add_column("mode")
    for c in CLASSES:
        t.add_column(c, justify="right", style=_STYLE[c])
    by_mode = comp.counts_by_mode()
    for mode, r in by_mode.iterrows():
        t.add_row(str(mode), *(str(int(r[c])) for c in CLASSES))
    total = comp.counts()
    t.add_row("all", *(str(total[c]) for c in CLASSES), style="bold")
    console.print(t)
    diff = comp.differences()
    if len(diff):
        d = Table(title=f"differences ({len(diff)})")
        for c in ("class", "entry", "mode", "expected", "actual", "error / note"):
            d.add_column(c, overflow="fold")
        head = diff.head(SHOW_LIMIT)
        for (_, r), where in zip(head.iterrows(), where_label(head), strict=True):
            err = f"{r['error_type']}: {r['error_message']}" if r["error_type"] else (r["error_message"] or r["note"])
            d.add_row(f"[{_STYLE[r['class']]}]{r['class']}[/]", r["entry_id"], where, r["expected"] or "-",
                      r["actual"] or "-", err[:120])
        console.print(d)
        if len(diff) > SHOW_LIMIT:
            console.print(f"... {len(diff) - SHOW_LIMIT} more in comparison.csv")


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        r = load_run(args.run)
        e = exp_mod.load_expected(args.expected)
        exp_mod.check_configuration(r, args.expected)
        scope = None if args.whole_zoo else run_scope(r.path)
        if scope is not None:
            print(f"compare: the run selected {len(scope.entry_ids)} entries ({scope.description}); expected "
                  f"entries outside them are not compared (--whole-zoo to compare all)")
        phases = run_phases(r.path)
        if phases is not None and set(phases) != set(schema.DEFAULT_PHASES):
            print(f"compare: the run selected the phase(s) {', '.join(sorted(phases))}; expected rows of other "
                  f"phases are not compared")
        comp = compare(r, e, scope=None if scope is None else scope.entry_ids, phases=phases)
        _print(comp, r.name, Path(args.expected))
        if not args.no_write:
            csv_path, md_path = write_comparison(comp, r, Path(args.expected))
            print(f"comparison: {csv_path} {md_path}")
        rc = comp.exit_code(args.accept_improvements, args.allow_missing)
        c = comp.counts()
        accept = f"hf-tpu accept {args.run}" + (
            "" if Path(args.expected) == exp_mod.DEFAULT_DIR else f" --expected {args.expected}"
        )
        if c["FAIL"]:
            print(f"{c['FAIL']} regression(s): fix them, or if intended, `{accept}`")
        if c["MISSING"] and not args.allow_missing:
            print(f"{c['MISSING']} expected row(s) missing or not measured in the run")
        if (c["IMPROVED"] or c["NEW"]) and not args.accept_improvements:
            print(
                f"{c['IMPROVED']} improved, {c['NEW']} new: update the expected results with "
                f"`{accept}` (or pass --accept-improvements)"
            )
        print("compare: " + ("OK" if rc == 0 else "FAILED"))
        return rc

    return guarded("compare", go)
