"""Before/after figures for issue 13 from the sample runs (reports/tmp-before-s*, reports/tmp-after-s*), written by
benchmarks/issue13/run_sample.sh (before: the starting code, both modes) and run_after.sh (after: compiled only).
Run from the worktree root: python benchmarks/issue13/figures.py"""
import glob
import sys

import pandas as pd

sys.path.insert(0, ".")
from harness.ci import coverage as cov  # noqa: E402
from harness.sweep.results import load_run_rows  # noqa: E402


def load(prefix):
    frames = [load_run_rows(d) for d in sorted(glob.glob(prefix + "-s*")) if glob.glob(d + "/rows/*.json")]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


before, after = load("reports/tmp-before"), load("reports/tmp-after")
print(f"before: {before['entry_id'].nunique()} entries, {len(before)} rows; after (compiled only): "
      f"{after['entry_id'].nunique()} entries")


def figs(df, label):
    h = cov.headline(df)
    print(f"  {label:38s} crash-free {h.crash_free}  where control works {h.crash_free_control}  "
          f"numerics-match {h.numerics_match}  timeouts {int((df['status'] == 'timeout').sum())}")


print("BEFORE, whole sample:")
for m in ("eager", "compiled"):
    figs(before[before["mode"] == m], m)
figs(before, "all rows")
ids = set(after["entry_id"])
bc = before[(before["mode"] == "compiled") & before["entry_id"].isin(ids)].copy()
# the control does not depend on the backend: a before row takes the cause its entry's after row recorded
cause = after.set_index("entry_id")["cause"]
bc["cause"] = bc["entry_id"].map(cause).fillna("")
print(f"COMPILED on the {len(ids)} entries the after run reached:")
figs(bc, "before")
figs(after, "after")
nt = lambda d: d[d["status"] != "timeout"]  # noqa: E731
figs(nt(bc), "before, timeouts left out")
figs(nt(after), "after, timeouts left out")
print("after: remaining run failures")
f = after[after["status"].isin(["compile_fail", "fail_to_run", "crash", "oom", "timeout"])]
for _, r in f.iterrows():
    print(f"  {r['status']:12s} cause={r['cause'] or '-':9s} {r['entry_id']}: {r['error_type']}: {r['error_message'][:90]}")
print("before: compiled run failures on those entries")
for _, r in bc[bc["status"].isin(["compile_fail", "fail_to_run", "crash", "oom", "timeout"])].iterrows():
    print(f"  {r['status']:12s} {r['entry_id']}: {r['error_type']}: {r['error_message'][:90]}")
