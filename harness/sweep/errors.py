"""Moved to harness/core/errors.py (the zoo's callers, the sweep, diagnose and upstream all classify errors, so
it sits below them); this name is kept for code that still imports it from here."""

from harness.core.errors import *  # noqa: F401,F403
from harness.core.errors import _OP_RE  # noqa: F401
