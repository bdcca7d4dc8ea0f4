"""`hf-tpu diagnose ENTRY [--mode eager|compiled] [--out DIR]`: where one entry first goes wrong on `tpu`.

Exit status: 0 when the entry passes, 1 when it fails (diagnosed: see the report and the repro), 2 on bad input
(unknown entry)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("entry", help="zoo entry id, e.g. transformers/llama/LlamaForCausalLM (test/<kind> for the "
                                 "sweep's test entries)")
    p.add_argument("--mode", default="eager", choices=("eager", "compiled"))
    p.add_argument("--out", default=None, help="report directory (default reports/diagnose/<entry>--<mode>)")
    p.add_argument("--zoo", default=None, help="where to find the entry: full (default) | smoke | a models-list CSV")
    p.add_argument("--precision", default="highest", choices=("highest", "high", "medium"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hub-layers", type=int, default=2)
    p.add_argument("--tolerances", default=None, help="YAML of per-entry numerics overrides (as for sweep)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON instead of a panel")


def run(args) -> int:
    import json
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from harness.diagnose.core import diagnose_entry, find_entry, safe_dirname
    from harness.diagnose.report import show
    from harness.sweep.numerics import load_overrides

    try:
        entry = find_entry(args.entry, args.zoo, args.hub_layers)
        overrides = load_overrides(args.tolerances)
    except (KeyError, ValueError) as exc:
        print(f"hf-tpu diagnose: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("reports") / "diagnose" / safe_dirname(entry.id, args.mode)
    out.mkdir(parents=True, exist_ok=True)
    d = diagnose_entry(entry, args.mode, out, precision=args.precision, dtype=args.dtype, seed=args.seed,
                       overrides=overrides)
    if args.json:
        print(json.dumps(d.to_json(), indent=2, default=str))
    else:
        show(d)
    return 0 if d.status == "pass" else 1
