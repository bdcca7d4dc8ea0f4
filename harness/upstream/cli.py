"""`hf-tpu upstream-tests --transformers-src DIR`: a Transformers checkout's model tests on cpu and on tpu.

Writes to --out: cpu.jsonl / tpu.jsonl (every test report, as it arrives), cpu.log / tpu.log (pytest's
output), upstream.csv (one row per test) and upstream.md (the share of CPU-passing tests that pass on tpu,
and the cpu-pass/tpu-fail tests by root cause)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.upstream import checkout, runner, table

DEVICES = ("cpu", "tpu")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transformers-src", required=True, type=Path, metavar="DIR",
                   help="root of a Transformers source checkout (its tests/ folder), at the installed version")
    p.add_argument("--families", default="all",
                   help="comma-separated tests/models/<family> names (e.g. bert,gpt2), or all (default)")
    p.add_argument("--transformers-version", default=None, metavar="X.Y.Z",
                   help="the checkout's version, when it has no sources to read it from (a bare tests/ copy)")
    p.add_argument("--devices", default="cpu,tpu", help="devices to run, in order (default cpu,tpu)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default reports/upstream-<time>)")
    p.add_argument("--jobs", type=int, default=2, help="pytest-xdist worker processes per device (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per test before it fails (default 600)")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select tests")
    p.add_argument("--table-only", action="store_true",
                   help="rebuild upstream.csv/upstream.md from the records already in --out; run nothing")


def _fail(msg: str) -> int:
    print(f"hf-tpu upstream-tests: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    out = (args.out or Path("reports") / time.strftime("upstream-%Y%m%d-%H%M%S")).resolve()  # pytest runs elsewhere
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    bad = [d for d in devices if d not in DEVICES]
    if bad or not devices:
        return _fail(f"--devices takes cpu and/or tpu, not {', '.join(bad) or 'nothing'}")
    if not args.table_only:
        src = args.transformers_src.resolve()
        try:
            version = checkout.check(src, args.transformers_version)
            families = checkout.select_families(src, args.families)
            root, extra = checkout.staged_root(src, out)
        except checkout.CheckoutError as exc:
            return _fail(str(exc))
        files = checkout.test_files(src, families)
        out.mkdir(parents=True, exist_ok=True)
        print(f"Transformers {version}: {len(files)} test files of {len(families)} families "
              f"({', '.join(families[:10])}{', …' if len(families) > 10 else ''}) -> {out}")
        for device in devices:
            records = out / f"{device}.jsonl"
            if records.exists():
                records.unlink()  # a new run of this device; the other device's records stay
            session = runner.Session(root=root, files=files, device=device, records=records,
                                     log=out / f"{device}.log", jobs=args.jobs, timeout_s=args.timeout,
                                     keyword=args.keyword, extra_path=extra)
            start = time.monotonic()
            code = runner.run(session)
            n = len(table.outcomes(table.read_records(records)))
            print(f"  {device}: {n} tests in {time.monotonic() - start:.0f} s (pytest exit code {code}; "
                  f"log {session.log})")
            if code not in (0, 1) and n == 0:
                return _fail(f"pytest could not run the {device} session (exit code {code}): see {session.log}")
    df = table.build(table.read_records(out / "cpu.jsonl"), table.read_records(out / "tpu.jsonl"))
    if df.empty:
        return _fail(f"no test records in {out}")
    table.write(out, df)
    print(f"CPU-passing tests that pass on tpu: {table.share(df)}; {out / 'upstream.csv'}, {out / 'upstream.md'}")
    return 0
