"""`hf-tpu diagnose`: the first module and ATen op that go wrong on `tpu` for one entry, and a runnable repro.
See core.py for the method."""

from harness.diagnose.core import Diagnosis, diagnose_built, diagnose_entry, diagnose_row, find_entry

__all__ = ["Diagnosis", "diagnose_built", "diagnose_entry", "diagnose_row", "find_entry"]
