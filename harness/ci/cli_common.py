"""What the harness.ci subcommands share: the error convention (status 2, one line naming problem and fix)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from harness.ci.runs import InputError


def guarded(command: str, fn: Callable[[], int]) -> int:
    """Run fn; an InputError becomes `hf-tpu COMMAND: error: ...` on stderr and exit status 2."""
    try:
        return fn()
    except InputError as exc:
        print(f"hf-tpu {command}: error: {exc}", file=sys.stderr)
        return 2
