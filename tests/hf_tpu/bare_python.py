"""A Python subprocess that runs no start-up files: `-S` skips site-packages' .pth files (hf-tpu's installed
start-up guard among them), and site-packages plus the work tree go on PYTHONPATH instead, so torch, its
entry points and hf_tpu are still found. Tests of the guard, and control cases that need the process as it
would be without it, run their code this way whether or not an install put the guard in site-packages."""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def argv(code: str) -> list[str]:
    return [sys.executable, "-S", "-c", code]


def pythonpath(*first: Path | str, with_root: bool = True) -> str:
    """`first`, then the work tree (unless with_root=False), then this interpreter's site-packages."""
    entries = [*map(str, first), *([str(ROOT)] if with_root else []), *site.getsitepackages()]
    return os.pathsep.join(entries)
