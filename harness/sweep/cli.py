"""`hf-tpu sweep`: run the zoo on `tpu`, eager and compiled, against a CPU baseline.

With no arguments: the smoke zoo, eager and compiled, outputs in reports/<run-id>/. Exit status: 0 when the
sweep ran (whatever the statuses), 2 on bad input, 1 when the device or the workers cannot run at all."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.core.model_dtype import FLOAT8_STORAGE, MODEL_DTYPES
from harness.schema import MODES, PHASES

PRECISIONS = ("highest", "high", "medium")
DTYPES = MODEL_DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to run")
    g.add_argument("--zoo", default=None, help="smoke (default) | full | a models-list CSV | test[:NAMES] (the harness's own test entries)")
    g.add_argument("--phases", default=None, help="comma-separated among inference,train (default inference): "
                   "train runs 3 AdamW steps per entry and mode against CPU (harness/sweep/train.py)")
    g.add_argument("--modes", default=None, help="comma-separated among eager,fused,compiled (default eager,compiled)")
    g.add_argument("--tp", type=int, default=None, metavar="N",
                   help="also run each entry tensor-parallel over N ranks (N=2; mode tp2): Transformers' "
                        "from_pretrained(tp_plan=\"auto\") in N rank processes (backend tpu_dist), logits compared "
                        "with the CPU baseline and the single-device eager run; a model without "
                        "base_model_tp_plan is `skipped` (not applicable). Without --modes: eager,tp2 "
                        "(harness/sweep/tensor_parallel.py)")
    g.add_argument("--precision", default=None, choices=PRECISIONS, help="float32 matmul precision on tpu (default highest)")
    g.add_argument("--dtype", default=None, choices=DTYPES, help="model dtype (default float32); a float8 name stores the weights "
                   "in float8 and computes in bfloat16 (Diffusers' layerwise casting, harness/core/model_dtype.py)")
    g.add_argument("--baseline", default=None, choices=("cpu", "cuda"), help="baseline device (cuda when present)")
    g.add_argument("--device", default=None, choices=("tpu", "cpu"),
                   help="device under test: tpu; cpu is the harness's own control (backend runs on CPU)")
    g.add_argument("--library", default=None, help="only entries of this library")
    g.add_argument("--task", default=None, help="only entries of this task family")
    g.add_argument("--match", default=None, metavar="REGEX", help="only entries whose id matches REGEX")
    g.add_argument("--limit", type=int, default=None, help="only the first N selected entries (by id)")
    g.add_argument("--shard", default=None, metavar="i/N", help="run shard i of N (1-based), deterministic")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--hub-layers", type=int, default=None, help="layer cap for Hub models-list entries (default 2)")
    g.add_argument("--tolerances", default=None, help="YAML of per-entry numerics overrides")
    r = p.add_argument_group("how to run")
    r.add_argument("--jobs", "-j", type=int, default=None,
                   help="entries run at once (default: the CPU count, at most 4)")
    r.add_argument("--timeout", type=float, default=300.0,
                   help="seconds per entry and phase: building and the CPU runs, then each mode (default 300)")
    r.add_argument("--memory-cap", type=float, default=0.0, metavar="GB",
                   help="per-worker memory cap in GB (default min(8, 0.8*RAM/jobs); negative: none)")
    r.add_argument("--repeats", type=int, default=3, help="steady-state calls per mode (default 3)")
    r.add_argument("--max-entries-per-worker", type=int, default=100,
                   help="a worker is replaced after this many entries (default 100)")
    r.add_argument("--executor", default="local", choices=("local", "ray", "inline"),
                   help="local: a pool of --jobs worker processes; ray: Ray tasks; inline: this process, "
                        "no isolation (debugging)")
    r.add_argument("--ray-address", default=None, help="Ray cluster address (default: a local ray.init())")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="output directory (default reports/<run-id>)")
    o.add_argument("--resume", action="store_true", help="finish an interrupted run in --out (default: the latest in reports/)")
    o.add_argument("--retry", default=None, metavar="STATUSES",
                   help="with --resume: also run again the entries with a row of one of these statuses "
                        "(comma-separated, e.g. timeout); their rows are replaced")
    o.add_argument("--progress", default="auto", choices=("auto", "bar", "lines", "none"))
    o.add_argument("--diagnose", action="store_true",
                   help="for each failing row, locate the first module and ATen op that go wrong and write a repro "
                        "(fills located_module, located_op, repro_path; reports in <out>/diagnose/)")
    o.add_argument("--canary", nargs="?", const="matmul:1.01", default=None, metavar="FAULT",
                   help="the harness's own sensitivity check: run each passing row once more with FAULT injected "
                        "into the backend (FAMILY[:FACTOR], FAMILY among matmul, conv, all; default matmul:1.01) "
                        "and record in column `canary` whether the numerics rule caught it; coverage.md states "
                        "the share caught")


class BadInput(ValueError):
    pass


def _latest_run(root: Path) -> Path | None:
    runs = sorted((d for d in root.glob("*") if (d / "run.json").exists()), key=lambda d: (d / "run.json").stat().st_mtime)
    return runs[-1] if runs else None


def build_options(args) -> SweepOptions:  # noqa: F821
    from harness.sweep.entries import SelectionError, compile_match, parse_shard
    from harness.sweep.options import SweepOptions
    from harness.sweep.results import ResultStore
    from harness.sweep.sweep import new_run_id

    given = {k: v for k, v in {
        "zoo": args.zoo, "precision": args.precision, "dtype": args.dtype, "baseline": args.baseline,
        "device": args.device, "library": args.library, "task": args.task, "match": args.match,
        "seed": args.seed, "hub_layers": args.hub_layers, "limit": args.limit}.items() if v is not None}
    if args.modes is not None:
        modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        bad = [m for m in modes if m not in MODES]
        if not modes or bad:
            raise BadInput(f"bad --modes {args.modes!r}: expected a comma-separated list among {', '.join(MODES)}")
        given["modes"] = tuple(m for m in MODES if m in modes)
    tp = getattr(args, "tp", None)
    if tp is not None:
        from harness.sweep.tensor_parallel import TP_MODES

        mode = f"tp{tp}"
        if mode not in TP_MODES:
            raise BadInput(f"bad --tp {tp}: supported: {', '.join(str(n) for n in TP_MODES.values())}")
        base_modes = given.get("modes", ("eager",))
        given["modes"] = tuple(m for m in MODES if m in (*base_modes, mode))
        if "train" in (args.phases or ""):
            raise BadInput("--tp runs inference only (a tensor-parallel train phase is not built)")
    if args.phases is not None:
        phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
        bad = [p for p in phases if p not in PHASES]
        if not phases or bad:
            raise BadInput(f"bad --phases {args.phases!r}: expected a comma-separated list among {', '.join(PHASES)}")
        given["phases"] = tuple(p for p in PHASES if p in phases)
    try:
        if args.shard is not None:
            given["shard"] = parse_shard(args.shard)
        compile_match(args.match)
    except SelectionError as exc:
        raise BadInput(str(exc)) from None
    if args.jobs is None:
        args.jobs = max(1, min(4, os.cpu_count() or 1))
    for name, value, low in (("--jobs", args.jobs, 1), ("--repeats", args.repeats, 0),
                             ("--max-entries-per-worker", args.max_entries_per_worker, 1)):
        if value < low:
            raise BadInput(f"bad {name} {value}: must be at least {low}")
    if args.timeout <= 0:
        raise BadInput(f"bad --timeout {args.timeout}: must be positive")
    retry = tuple(x.strip() for x in (getattr(args, "retry", None) or "").split(",") if x.strip())
    if retry and not args.resume:
        raise BadInput("--retry needs --resume (it re-runs entries of a run being finished)")
    from harness.schema import STATUSES

    if any(x not in STATUSES for x in retry):
        raise BadInput(f"bad --retry {args.retry!r}: expected statuses among {', '.join(STATUSES)}")
    phases = [x.strip() for x in (args.phases or "").split(",")]
    if "train" in phases and (args.dtype or "float32") in FLOAT8_STORAGE:
        raise BadInput(f"--dtype {args.dtype} with --phases train: float8 storage (layerwise casting) is for "
                       "inference; its weights take no optimizer step. Train at float32 or bfloat16")
    if args.limit is not None and args.limit < 1:
        raise BadInput(f"bad --limit {args.limit}: must be at least 1")

    out = Path(args.out) if args.out else None
    if args.resume:
        if out is None:
            out = _latest_run(Path("reports"))
            if out is None:
                raise BadInput("--resume: no run to resume in reports/ (give --out DIR)")
        meta = ResultStore(out).read_run()
        if meta is None:
            raise BadInput(f"--resume: {out} is not a sweep output directory (no run.json)")
        sel = meta["selection"]
        for k, v in given.items():
            old = sel.get(k)
            if (list(v) if isinstance(v, tuple) else v) != old:
                raise BadInput(f"--resume: {k}={v!r} differs from the run being resumed ({k}={old!r})")
        base = {k: (tuple(v) if isinstance(v, list) else v) for k, v in sel.items()}
        run_id = meta.get("run_id") or out.name
    else:
        base = {}
        run_id = new_run_id()
        if out is None:
            out = Path("reports") / run_id
        elif (out / "rows").is_dir() and any((out / "rows").glob("*.json")):
            raise BadInput(f"{out} already holds sweep results: use --resume to finish it, or another --out")
    opts = SweepOptions(**{**base, **given}, jobs=args.jobs, timeout=args.timeout, memory_cap_gb=args.memory_cap,
                        repeats=args.repeats, max_entries_per_worker=args.max_entries_per_worker,
                        executor=args.executor, ray_address=args.ray_address, tolerances=args.tolerances,
                        out=str(out), run_id=run_id, resume=args.resume, retry=retry, progress=args.progress,
                        diagnose=getattr(args, "diagnose", False), canary=getattr(args, "canary", None))
    if opts.canary is not None:
        from harness.sweep.canary import parse_fault

        try:
            parse_fault(opts.canary)
        except ValueError as exc:
            raise BadInput(f"--canary: {exc}") from None
    if opts.tolerances is not None and not os.path.isfile(opts.tolerances):
        raise BadInput(f"--tolerances: no such file {opts.tolerances!r}")
    return opts


def run(args) -> int:
    from harness.sweep import outputs, tensor_parallel
    from harness.sweep.entries import SelectionError, load_entries
    from harness.sweep.executors import WorkerStartupError
    from harness.sweep.numerics import load_overrides
    from harness.sweep.results import check_writable
    from harness.sweep.sweep import run_sweep

    def fail(code: int, msg: str) -> int:
        print(f"hf-tpu sweep: error: {msg}", file=sys.stderr)
        return code

    try:
        opts = build_options(args)
        load_overrides(opts.tolerances)
        entries = load_entries(opts)
    except (BadInput, SelectionError, ValueError) as exc:
        return fail(2, str(exc))
    try:
        check_writable(Path(opts.out))
    except OSError as exc:
        return fail(2, f"cannot write the output directory {opts.out}: {exc.strerror or exc}")
    if opts.device == "tpu":
        try:
            from harness.sweep.device import get_device

            get_device("tpu").check()
        except Exception as exc:  # noqa: BLE001
            return fail(1, f"the `tpu` device is not usable here: {type(exc).__name__}: {exc}")
    if opts.baseline == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("hf-tpu sweep: no CUDA device: the baseline runs on CPU", file=sys.stderr)
            opts.baseline = "cpu"
    print(f"hf-tpu sweep: {len(entries)} entries from zoo {opts.zoo!r}, modes {','.join(opts.modes)}, "
          f"precision {opts.precision}, dtype {opts.dtype}, jobs {opts.jobs}, executor {opts.executor}"
          + (f", shard {opts.shard[0]}/{opts.shard[1]}" if opts.shard != (1, 1) else "") + f" -> {opts.out}",
          file=sys.stderr)
    try:
        result = run_sweep(opts, entries=entries)
    except WorkerStartupError as exc:
        return fail(1, str(exc))
    h = outputs.headline(result.df)
    print(f"\n{outputs.headline_text(result.df)}")
    for mode in opts.modes:
        sub = result.df[result.df["mode"] == mode]
        print(f"  {mode:9s} {outputs.headline_text(sub)}")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in h["statuses"].items()))
    if any(m in tensor_parallel.TP_MODES for m in opts.modes):
        print(tensor_parallel.summary_text(result.df))
    if result.resumed:
        print(f"resumed: {result.resumed} entries already written, {result.ran} run now")
    print(f"reports: {result.out}/ (results.csv, coverage.md, crashes.md, numerics.md)")
    return 0
