"""`hf-tpu upstream-tests`: a Transformers source checkout's own model tests, on cpu and on tpu.

checkout.py  which checkout, which version, which families and test files (and a staged root when the
             checkout is only a `tests/` folder)
plugin.py    the pytest plugin that records one JSON line per test report, as it arrives
runner.py    one pytest-xdist session per device (a crashed worker costs one test: xdist replaces it)
table.py     upstream.csv (one row per test, both outcomes) and the cpu-pass/tpu-fail causes
cli.py       the subcommand
"""
