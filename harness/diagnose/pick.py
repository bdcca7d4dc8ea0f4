"""`hf-tpu diagnose ENTRY` without `--mode`: which mode to diagnose. The failing mode of the entry's row in the
newest results.csv that has the entry (eager first when both fail: it is the smaller program); without such a
row the caller tries eager, then compiled."""

from __future__ import annotations

from pathlib import Path

FAILING = ("fail_accuracy", "fail_to_run", "compile_fail")
MODES = ("eager", "compiled")


def results_files(root: str | Path) -> list[Path]:
    """results.csv files under `root` (a run directory or a directory of runs), newest first."""
    root = Path(root)
    if not root.exists():
        return []
    files = [root / "results.csv"] if (root / "results.csv").is_file() else []
    files += [p for p in root.glob("**/results.csv") if p != root / "results.csv"]
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


def mode_from_results(entry_id: str, root: str | Path = "reports",
                      phase: str = "inference") -> tuple[str | None, Path | None]:
    """(failing mode, the results.csv it came from) from the newest file that has `entry_id` in `phase`; (None,
    that file) when it has the entry passing in every mode; (None, None) when no file has it. Files from before
    the phase column hold inference rows."""
    import pandas as pd

    for path in results_files(root):
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
            df = df[["entry_id", "mode", "status"] + (["phase"] if "phase" in df.columns else [])]
        except (ValueError, KeyError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue  # not a sweep's results.csv (or unreadable): look further
        in_phase = df["phase"].replace("", "inference") == phase if "phase" in df.columns else phase == "inference"
        rows = df[(df["entry_id"] == entry_id) & in_phase]
        if rows.empty:
            continue
        status = dict(zip(rows["mode"], rows["status"], strict=False))
        for m in MODES:
            if status.get(m) in FAILING:
                return m, path
        return None, path
    return None, None
