"""Issue 13's figures from one sweep of the fixed sample (shards 1, 11, 21, 31 of 40 of the full zoo, both modes),
e.g. the outputs benchmarks/sweep_bench.py keeps with --work:

    python benchmarks/issue13/sample_figures.py reports/tmp-bench1/both-warm-j2

Prints per mode: crash-free over all rows and over rows whose control works, numerics-match; then the run
failures grouped by cause and root cause (harness/ci/coverage.py's tables), and the fail_accuracy rows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.ci import coverage as cov  # noqa: E402
from harness.sweep.results import load_run_rows  # noqa: E402


def main(run_dir: str) -> None:
    df = load_run_rows(run_dir)
    print(f"{run_dir}: {df['entry_id'].nunique()} entries, {len(df)} rows, "
          f"timeouts {int((df['status'] == 'timeout').sum())}")
    for label, sub in [(m, df[df["mode"] == m]) for m in ("eager", "compiled")] + [("all rows", df)]:
        h = cov.headline(sub)
        print(f"  {label:9s} crash-free {h.crash_free}  where the control works {h.crash_free_control}  "
              f"numerics-match {h.numerics_match}")
    print("run failures (cause, mode, entry, error):")
    fails = df[df["status"].isin(["compile_fail", "fail_to_run", "crash", "oom", "timeout"])]
    for _, r in fails.sort_values(["cause", "mode"]).iterrows():
        print(f"  {r['cause'] or '?':8s} {r['mode']:8s} {r['status']:12s} {r['entry_id']}: "
              f"{r['error_type']}: {str(r['error_message'])[:110]}")
    print("fail_accuracy rows (mode, entry, reference, reason):")
    for _, r in df[df["status"] == "fail_accuracy"].sort_values(["entry_id", "mode"]).iterrows():
        print(f"  {r['mode']:8s} {r['entry_id']}: reference {str(r['reference'])[:50]}; "
              f"{str(r['error_message'])[:110]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports/tmp-bench1/both-warm-j2")
