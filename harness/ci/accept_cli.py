"""`hf-tpu accept RUN`: rewrite the expected results (reports/expected/<mode>.csv) from a run."""

from __future__ import annotations

import argparse

from harness.ci import expected as exp_mod
from harness.ci.cli_common import guarded
from harness.ci.runs import load_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory holding results.csv")
    parser.add_argument(
        "--expected", metavar="DIR", default=str(exp_mod.DEFAULT_DIR),
        help="expected-results directory to rewrite (default: %(default)s)",
    )
    parser.add_argument(
        "--update", action="store_true",
        help="only add or change the run's entries, keep the other accepted entries (for a partial re-run)",
    )


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        r = load_run(args.run)
        res = exp_mod.accept(r, args.expected, update=args.update)
        for mode, p in res.written.items():
            print(f"accept: {p}: {res.rows[mode]} entries, {res.changed[mode]} changed")
        print(f"accept: flaky list {args.expected}/{exp_mod.FLAKY} left as is")
        return 0

    return guarded("accept", go)
