"""Helpers for the sweep tests (a uniquely named module: the test tree has no packages)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", "sweep", *args]


def run_cli(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(list(args), cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)
