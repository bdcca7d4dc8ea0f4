"""One pytest session per device over the chosen test files, in pytest-xdist workers: a test that kills its
worker (a segfault) is reported as crashed by the controller, and xdist starts a new worker for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.upstream import plugin

# Transformers' tests read their device and which groups to run from these (tests/README of the checkout).
BASE_ENV = {"RUN_SLOW": "0", "RUN_PIPELINE_TESTS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Session:
    """What one device's pytest session needs."""

    root: Path  # the directory pytest runs from (the checkout, or its staged root)
    files: list[str]  # test files, relative to root
    device: str  # cpu | tpu
    records: Path  # the JSON-lines file the plugin appends to
    log: Path  # pytest's own output
    jobs: int = 2
    timeout_s: float = 600.0  # per test (pytest-timeout)
    keyword: str | None = None  # pytest -k
    extra_path: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)


def command(s: Session) -> list[str]:
    if s.jobs < 1:
        raise ValueError("--jobs must be at least 1: tests run in worker processes so that a crash costs one test")
    cmd = [sys.executable, "-m", "pytest", *s.files, "-p", "harness.upstream.plugin", "-p", "no:cacheprovider",
           "-n", str(s.jobs), "--max-worker-restart", "1000000", "--timeout", str(s.timeout_s), "-q",
           "-W", "ignore::DeprecationWarning", "--tb=short"]
    if s.keyword:
        cmd += ["-k", s.keyword]
    return cmd + s.pytest_args


def environment(s: Session) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BASE_ENV)
    env["TRANSFORMERS_TEST_DEVICE"] = s.device
    env[plugin.ENV] = str(s.records)
    # the harness itself (for the plugin) and any stand-in modules must be importable in the workers
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *s.extra_path, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(s: Session) -> int:
    """Run the session to its end; pytest's exit code (1 when some test failed, which is expected)."""
    s.records.parent.mkdir(parents=True, exist_ok=True)
    with open(s.log, "a", encoding="utf-8") as log:
        log.write(f"$ TRANSFORMERS_TEST_DEVICE={s.device} {' '.join(command(s))}\n")
        log.flush()
        proc = subprocess.run(command(s), cwd=s.root, env=environment(s), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False)
    return proc.returncode
