"""`hf-tpu report RUN [RUN ...]`: the static HTML dashboard (harness.ci.dashboard)."""

from __future__ import annotations

import argparse
import sys

from harness.ci import coverage as cov
from harness.ci.cli_common import guarded
from harness.ci.dashboard import order_runs, write_dashboard
from harness.ci.runs import InputError, load_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", metavar="RUN", nargs="+",
        help="run directories (results.csv inside); the latest by timestamp is shown in detail, all make the trend",
    )
    parser.add_argument("--out", metavar="FILE", help="output HTML file (default: LATEST_RUN/dashboard.html)")
    parser.add_argument("--worst", type=int, default=20, metavar="N", help="rows in the worst-numerics table")
    parser.add_argument(
        "--screenshot", metavar="PNG",
        help="also save a 1280x2000 screenshot of the page (needs headless Chromium)",
    )
    parser.add_argument(
        "--skip-unreadable", action="store_true",
        help="leave out (with a warning) runs that cannot be read, e.g. an old schema version in a trend "
        "history; the last RUN given is never skipped",
    )


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        runs = []
        for i, r in enumerate(args.runs):
            try:
                runs.append(load_run(r))
            except InputError as exc:
                if not args.skip_unreadable or i == len(args.runs) - 1:
                    raise
                print(f"hf-tpu report: warning: skipping {r}: {exc}", file=sys.stderr)
        out = write_dashboard(runs, args.out, worst=args.worst)
        h = cov.headline(order_runs(runs)[-1].df)
        print(f"crash-free {h.crash_free} · numerics-match {h.numerics_match}")
        print(f"dashboard: {out}")
        if args.screenshot:
            from harness.ci.browser import BrowserError, file_url, screenshot

            try:
                print(f"screenshot: {screenshot(file_url(out), args.screenshot)}")
            except BrowserError as exc:
                print(f"hf-tpu report: error: no screenshot: {exc}", file=sys.stderr)
                return 1
        return 0

    return guarded("report", go)
