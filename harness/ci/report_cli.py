"""`hf-tpu report RUN [RUN ...]`: the static HTML dashboard (harness.ci.dashboard)."""

from __future__ import annotations

import argparse

from harness.ci import coverage as cov
from harness.ci.cli_common import guarded
from harness.ci.dashboard import order_runs, write_dashboard
from harness.ci.runs import load_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", metavar="RUN", nargs="+",
        help="run directories (results.csv inside); the latest by timestamp is shown in detail, all make the trend",
    )
    parser.add_argument("--out", metavar="FILE", help="output HTML file (default: LATEST_RUN/dashboard.html)")
    parser.add_argument("--worst", type=int, default=20, metavar="N", help="rows in the worst-numerics table")


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        runs = [load_run(r) for r in args.runs]
        out = write_dashboard(runs, args.out, worst=args.worst)
        h = cov.headline(order_runs(runs)[-1].df)
        print(f"crash-free {h.crash_free} · numerics-match {h.numerics_match}")
        print(f"dashboard: {out}")
        return 0

    return guarded("report", go)
