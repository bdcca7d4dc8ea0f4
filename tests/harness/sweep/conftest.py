import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", "sweep", *args]


def run_cli(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(list(args), cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cpu_opts(tmp_path):
    from harness.sweep.options import SweepOptions

    return SweepOptions(zoo="test", device="cpu", out=str(tmp_path / "run"), run_id="t", timeout=10,
                        memory_cap_gb=1.5, progress="none", repeats=1)
