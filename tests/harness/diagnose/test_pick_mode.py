"""`hf-tpu diagnose ENTRY` without --mode (harness/diagnose/pick.py and the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.ci.sample import row, write_run
from harness.diagnose.pick import mode_from_results

REPO = Path(__file__).resolve().parents[3]


def _run(d: Path, rows: list[dict], age_s: float = 0.0) -> Path:
    p = write_run(d, rows) / "results.csv"
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_newest_results_with_the_entry_decide(tmp_path) -> None:
    old = _run(tmp_path / "old", [row("x/a", mode="eager", status="fail_to_run"),
                                  row("x/a", mode="compiled", status="fail_to_run")], age_s=100)
    new = _run(tmp_path / "new", [row("x/a", mode="eager", status="pass"),
                                  row("x/a", mode="compiled", status="compile_fail")], age_s=10)
    _run(tmp_path / "newest", [row("x/other", mode="eager", status="fail_to_run")])  # has not the entry
    assert mode_from_results("x/a", tmp_path) == ("compiled", new)
    os.utime(old, None)  # now the old run is the newest: eager first when both fail
    assert mode_from_results("x/a", tmp_path) == ("eager", old)
    _run(tmp_path / "passing", [row("x/a", mode="eager", status="pass"), row("x/a", mode="compiled")])
    assert mode_from_results("x/a", tmp_path) == (None, tmp_path / "passing" / "results.csv")
    assert mode_from_results("x/none", tmp_path) == (None, None)
    assert mode_from_results("x/a", tmp_path / "missing") == (None, None)


def test_the_train_phase_picks_among_train_rows(tmp_path) -> None:
    both = _run(tmp_path / "both", [row("x/a", mode="eager", status="pass"),
                                    row("x/a", mode="compiled", status="pass"),
                                    row("x/a", mode="eager", status="pass", phase="train"),
                                    row("x/a", mode="compiled", status="fail_accuracy", phase="train")])
    assert mode_from_results("x/a", tmp_path) == (None, both)  # the inference rows pass
    assert mode_from_results("x/a", tmp_path, "train") == ("compiled", both)
    assert mode_from_results("x/b", tmp_path, "train") == (None, None)


def _diagnose(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "harness", "diagnose", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_without_mode_uses_the_results_then_tries_both(tmp_path) -> None:
    # test/raise fails on tpu in both modes; the results say compiled, so compiled is diagnosed
    _run(tmp_path / "runs" / "r1", [row("test/raise", mode="eager", status="pass"),
                                    row("test/raise", mode="compiled", status="fail_to_run")])
    p = _diagnose("test/raise", "--reports", str(tmp_path / "runs"), "--out", str(tmp_path / "d1"), "--json")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "mode compiled (failing in" in p.stderr and '"mode": "compiled"' in p.stdout
    # no results: eager is tried first, and it fails
    p = _diagnose("test/raise", "--reports", str(tmp_path / "empty"), "--out", str(tmp_path / "d2"), "--json")
    assert p.returncode == 1 and "trying eager, then compiled" in p.stderr and '"mode": "eager"' in p.stdout
