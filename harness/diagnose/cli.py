"""`hf-tpu diagnose ENTRY [--mode eager|compiled] [--phase inference|train] [--out DIR]`: where one entry first
goes wrong on `tpu`. `--phase train` diagnoses its train row (harness/diagnose/train.py): every step replayed,
the first diverging step and tensor (loss, gradient or weight after the optimizer step), then the op, or the
optimizer.

Without --mode: the failing mode of the entry in the newest results.csv under --reports that has it, else
eager, then compiled if eager passes (harness/diagnose/pick.py).

Exit status: 0 when the entry passes, 1 when it fails (diagnosed: see the report and the repro), 2 on bad input
(unknown entry)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("entry", help="zoo entry id, e.g. transformers/llama/LlamaForCausalLM (test/<kind> for the "
                                 "sweep's test entries)")
    p.add_argument("--mode", default=None, choices=("eager", "compiled"),
                   help="default: the failing mode in the newest results.csv with the entry, else try both")
    p.add_argument("--phase", default="inference", choices=("inference", "train"),
                   help="which row to diagnose: the forward (default) or the train phase's steps")
    p.add_argument("--reports", default="reports", help="where to look for results.csv files when --mode is "
                                                         "not given (default reports/)")
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
    kw = dict(precision=args.precision, dtype=args.dtype, seed=args.seed, overrides=overrides)

    def diagnose(mode: str):
        name = safe_dirname(entry.id, mode) + ("-train" if args.phase == "train" else "")
        out = Path(args.out) if args.out else Path("reports") / "diagnose" / name
        out.mkdir(parents=True, exist_ok=True)
        if args.phase == "train":
            from harness.diagnose.train import diagnose_train_entry

            return diagnose_train_entry(entry, mode, out, **kw)
        return diagnose_entry(entry, mode, out, **kw)

    if args.mode:
        d = diagnose(args.mode)
    else:
        from harness.diagnose.pick import mode_from_results

        mode, source = mode_from_results(entry.id, args.reports, args.phase)
        if mode:
            print(f"hf-tpu diagnose: mode {mode} (failing in {source})", file=sys.stderr)
            d = diagnose(mode)
        else:
            why = f"passes in {source}" if source else f"no results.csv under {args.reports} has it"
            print(f"hf-tpu diagnose: {entry.id} {why}: trying eager, then compiled", file=sys.stderr)
            d = diagnose("eager")
            if d.status == "pass":
                d = diagnose("compiled")
    if args.json:
        print(json.dumps(d.to_json(), indent=2, default=str))
    else:
        show(d)
    return 0 if d.status == "pass" else 1
