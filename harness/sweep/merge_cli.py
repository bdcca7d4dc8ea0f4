"""`hf-tpu merge RUN_DIR... [--out DIR]`: join the outputs of sharded sweeps into one results.csv and reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="sweep output directories (shards)")
    p.add_argument("--out", default=None, help="merged output directory (default reports/merged-<time>)")
    p.add_argument("--later-wins", action="store_true",
                   help="where runs disagree on an (entry, mode), keep the row of the run given last (a partial "
                        "re-run, e.g. `sweep --match`, given after the sweep it corrects); without it that is an error")


def run(args) -> int:
    from harness.sweep import outputs
    from harness.sweep.merge import MergeError, merge_runs
    from harness.sweep.results import check_writable
    from harness.sweep.sweep import new_run_id

    for d in args.runs:
        if not Path(d).is_dir():
            print(f"hf-tpu merge: error: {d} is not a directory", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else Path("reports") / f"merged-{new_run_id()}"
    try:
        check_writable(out)
    except OSError as exc:
        print(f"hf-tpu merge: error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        df, paths = merge_runs(args.runs, out, later_wins=args.later_wins)
    except MergeError as exc:
        print(f"hf-tpu merge: error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.runs)} runs: {len(df)} rows, {df['entry_id'].nunique()} entries")
    print(outputs.headline_text(df))
    print(f"reports: {out}/ (results.csv, coverage.md, crashes.md, numerics.md)")
    return 0
