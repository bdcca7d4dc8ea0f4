"""Small file helpers shared by harness.ci."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(p: Path, text: str) -> None:
    """Write via a temp file and rename: a killed process never leaves a half-written file that is trusted."""
    p = Path(p)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
