"""Nightly CI support: expected results (`accept`), comparison with them (`compare`), the coverage figures
and the static HTML dashboard (`report`)."""
