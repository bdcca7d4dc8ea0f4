"""Bounded dynamism on the zoo's causal LMs, as a TorchTPU user would run a server with variable lengths:

    compiled = torch.compile(model, backend="tpu")
    for n in 1..64:
        ids = ...[:, :n].to("tpu"); torch._dynamo.mark_dynamic(ids, 1, min=2, max=64)
        logits = compiled(input_ids=ids).logits

Per model: whether the logits equal CPU's (float32, matmul precision highest, rtol=atol=1e-4) at every
length, the XLA compilations over the 64 lengths (the ideal is 2: length 1, which Dynamo always
specialises, and the one bucket [2, 64]), and whether the graph was padded or kept static shapes (the op
that kept it static is logged). Rows go to a JSON-lines file as they finish, so a long run can be resumed.

A row that errors records the length it failed at (`error_at`) and, in `cpu_eager`, the same loop up to that
length on CPU with `backend="eager"` in a child process without hf_tpu. The summary counts an error as the
model's own only when that run fails with the same error class at the same length (e.g. Mamba-style
chunking specialises the length, so Dynamo raises ConstraintViolationError for the marked dimension on any
backend: TorchTPU 0.2.0's backend also only sees graphs after Dynamo, so it raises the same); an error that
CPU eager does not have is hf-tpu's.

    python benchmarks/bounded_dynamism.py --zoo smoke
    python benchmarks/bounded_dynamism.py --zoo full --out reports/bounded/full.jsonl   # every causal LM
    python benchmarks/bounded_dynamism.py --out reports/bounded/full.jsonl --summary reports/bounded/summary.txt
"""

from __future__ import annotations

import argparse
import collections
import copy
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


class _Reasons(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def _ids(entry: Any, model: Any, max_len: int, batch: int) -> tuple[torch.Tensor, int]:
    """The token ids of every length (sliced per length) and the longest length. MusicGen decoders read
    one row of audio codes per codebook, (batch * num_codebooks, length), as the zoo feeds them
    (harness/zoo/override_inputs.py): `batch` rows would not reshape to their (batch, codebooks, length)."""
    from harness.zoo.override_inputs import _codebook_rows
    from harness.zoo.overrides import rule_for

    config = model.config
    vocab = int(getattr(config, "vocab_size", 0) or getattr(config.get_text_config(), "vocab_size", 0))
    # XLNet has no position table: max_position_embeddings is -1 (the run crashed on a [2, -1] tensor)
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    limit = min(max_len, positions) if positions > 0 else max_len
    rows = batch
    if rule_for(entry.model_type).inputs is _codebook_rows:  # the family's type, as the zoo looks it up
        rows *= int((getattr(config, "decoder", None) or config).num_codebooks)
    return torch.randint(0, vocab, (rows, limit), generator=torch.Generator().manual_seed(0)), limit


def run_model(entry: Any, max_len: int, batch: int) -> dict[str, Any]:
    from hf_tpu import compile as C
    from hf_tpu.precision import cpu_reference

    row: dict[str, Any] = {"id": entry.id}
    start = time.time()
    try:
        built = entry.build(seed=0)
    except Exception as exc:  # noqa: BLE001 - a model the zoo cannot build is reported, not fatal
        return {**row, "status": "build_error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    model = built.model.eval()
    row["build_s"] = round(time.time() - start, 1)
    ids_all, limit = _ids(entry, model, max_len, batch)
    cpu_model = copy.deepcopy(model)
    tpu_model = model.to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(tpu_model, backend="tpu")
    reasons = _Reasons()
    logging.getLogger("hf_tpu.bounded").addHandler(reasons)
    C.reset_stats()
    worst, wrong_at = 0.0, []
    # where the time goes: the first two calls trace and compile (length 1, then the bucket), the rest run
    cpu_s, call_s = 0.0, []
    n = 0
    try:
        for n in range(1, limit + 1):
            ids = ids_all[:, :n]
            x = ids.to("tpu")
            if n >= 2:  # Dynamo specialises sizes 0 and 1 whatever is marked
                torch._dynamo.mark_dynamic(x, 1, min=2, max=limit)
            with torch.no_grad():
                t = time.time()
                got = compiled(input_ids=x).logits.cpu()
                call_s.append(time.time() - t)
                t = time.time()
                with cpu_reference():
                    want = cpu_model(input_ids=ids).logits
                cpu_s += time.time() - t
            err = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            worst = max(worst, err)
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                wrong_at.append(n)
    except Exception as exc:  # noqa: BLE001
        row.update(status="error", error=_error(exc), error_at=n)
    finally:
        logging.getLogger("hf_tpu.bounded").removeHandler(reasons)
    st = C.stats()
    row.setdefault("status", "correct" if not wrong_at else "wrong")
    row.update(lengths=limit, worst_abs_err=worst, wrong_at=wrong_at[:8], compilations=st["compilations"],
               graphs=st["graphs"], padded_graphs=st["padded_graphs"], static_graphs=st["static_dynamic_graphs"],
               graph_breaks=st["graph_breaks"], static_reason=reasons.seen[0][:300] if reasons.seen else "",
               seconds=round(time.time() - start, 1), cpu_ref_s=round(cpu_s, 1),
               first_calls_s=round(sum(call_s[:2]), 1), other_calls_s=round(sum(call_s[2:]), 1),
               aot_s=round(st.get("aot_s", 0.0), 1), xla_s=round(st.get("xla_s", 0.0), 1))
    if row["status"] == "error":
        row["cpu_eager"] = cpu_eager_check(entry.id, row["error_at"], max_len, batch)
    return row


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def _cpu_eager_loop(entry_id: str, upto: int, max_len: int, batch: int) -> dict[str, Any]:
    """The benchmark's loop up to length `upto` on CPU with Dynamo's "eager" backend (Dynamo traces and
    guards as for `tpu`, but the graph runs as plain PyTorch), in a process where hf_tpu is not loaded."""
    from harness.zoo import load_zoo, select

    torch.set_float32_matmul_precision("highest")
    entry = next(e for e in select(load_zoo("full"), task="causal-lm") if e.id == entry_id)
    model = entry.build(seed=0).model.eval()
    ids_all, limit = _ids(entry, model, max_len, batch)
    compiled = torch.compile(model, backend="eager")
    out: dict[str, Any] = {"backend": "eager", "device": "cpu", "hf_tpu_loaded": "hf_tpu" in sys.modules}
    n = 0
    try:
        for n in range(1, min(upto, limit) + 1):
            x = ids_all[:, :n].clone()
            if n >= 2:
                torch._dynamo.mark_dynamic(x, 1, min=2, max=limit)
            with torch.no_grad():
                compiled(input_ids=x)
        out.update(status="ran", lengths=n)
    except Exception as exc:  # noqa: BLE001 - the error is the finding
        out.update(status="error", error=_error(exc), error_at=n)
    return out


def cpu_eager_check(entry_id: str, upto: int, max_len: int, batch: int) -> dict[str, Any]:
    """Whether an error on `tpu` is the model's own: the same loop on CPU with backend="eager" in a child
    process without hf_tpu (TORCH_DEVICE_BACKEND_AUTOLOAD=0, so `import torch` does not load it)."""
    import subprocess

    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, os.path.abspath(__file__), "--cpu-eager-check", entry_id, "--upto", str(upto),
           "--max-len", str(max_len), "--batch", str(batch)]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {"backend": "eager", "device": "cpu", "status": "check_failed", "error": "timed out after 1800 s"}
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"backend": "eager", "device": "cpu", "status": "check_failed",
                "error": (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1][:300]}
    return json.loads(lines[-1])


def _op(reason: str) -> str:
    """The op (and why) a static-fallback row names, without the graph's tensors."""
    reason = reason.split("static shapes for this graph (", 1)[-1]
    return reason.split(" (", 1)[0].rstrip(")")


def _cls(error: str | None) -> str:
    return (error or "").split(":")[0]


def error_kind(row: dict[str, Any]) -> str:
    """Whose an error row's error is, from the CPU backend="eager" run recorded in the row: "model" when
    that run (hf_tpu not loaded) fails with the same class at the same length, "hf-tpu" when it runs, and
    "unchecked" otherwise (no check, or the check itself failed, or a different error)."""
    check = row.get("cpu_eager") or {}
    if check.get("status") == "ran":
        return "hf-tpu"
    if (check.get("status") == "error" and _cls(check.get("error")) == _cls(row.get("error"))
            and check.get("error_at") == row.get("error_at")):
        return "model"
    return "unchecked"


def _model_reason(row: dict[str, Any]) -> str:
    err = row.get("error") or ""
    if err.startswith("ConstraintViolationError") and "size()[1]" in err:
        return "model specializes the length (same on CPU with backend=eager)"
    return f"{_cls(err)} (same on CPU with backend=eager: the model with these inputs)"


def summary(rows: list[dict[str, Any]]) -> str:
    built = [r for r in rows if r["status"] != "build_error"]
    correct = [r for r in built if r["status"] == "correct"]
    padded = [r for r in correct if r.get("padded_graphs", 0) and not r.get("static_graphs", 0)]
    comps = [r["compilations"] for r in correct]
    errors = [r for r in built if r["status"] == "error"]
    kinds = {k: [r for r in errors if error_kind(r) == k] for k in ("model", "hf-tpu", "unchecked")}
    runnable = len(built) - len(kinds["model"])
    lines = [f"{len(rows)} causal LMs, {len(built)} built: {len(correct)} correct at every length "
             f"({100 * len(correct) / max(len(built), 1):.1f}%), {len(padded)} of them with every graph padded; "
             f"wrong {sum(r['status'] == 'wrong' for r in built)}, errors {len(errors)}",
             f"errors: {len(kinds['model'])} the model's own (the same error at the same length on CPU with "
             f"backend=eager, hf_tpu not loaded: recorded per row), {len(kinds['hf-tpu'])} hf-tpu's (CPU "
             f"backend=eager runs), {len(kinds['unchecked'])} not checked; correct: "
             f"{100 * len(correct) / max(runnable, 1):.1f}% of the {runnable} built models whose CPU "
             "backend=eager run does not fail",
             f"compilations over the lengths (correct models): "
             + ", ".join(f"{c}: {n}" for c, n in sorted(collections.Counter(comps).items()))
             + (f" (median {statistics.median(comps)})" if comps else "")]
    static = collections.Counter(_op(r["static_reason"]) for r in correct if r.get("static_graphs"))
    lines += ["static fallbacks (correct models) by the first op without a rule:"]
    lines += [f"  {n} {op}" for op, n in static.most_common()]
    lines += ["errors, the model's own:"]
    lines += [f"  {n} {why}" for why, n in collections.Counter(map(_model_reason, kinds["model"])).most_common()]
    for kind, title in (("hf-tpu", "errors, hf-tpu's"), ("unchecked", "errors, not checked on CPU")):
        lines += [f"{title}: " + ", ".join(f"{k} {n}" for k, n in
                                            collections.Counter(_cls(r.get("error")) for r in kinds[kind]).most_common())]
    breaks = [r for r in correct if r.get("graph_breaks") and not r.get("static_graphs")]
    lines += [f"graph breaks (correct, every graph padded or static for another reason): {len(breaks)}"]
    for r in rows:
        if r in breaks:
            lines.append(f"  {r['id']}: {r['graph_breaks']} graph breaks, {r['compilations']} compilations")
        elif r["status"] == "error":
            kind = error_kind(r)
            label = {"model": "error (model's own)", "hf-tpu": "error (hf-tpu)", "unchecked": "error (unchecked)"}
            lines.append(f"  {r['id']}: {label[kind]} at length {r.get('error_at', '?')}: {r.get('error')}")
        elif r["status"] != "correct" or r.get("static_graphs"):
            lines.append(f"  {r['id']}: {r['status']} {r.get('error') or _op(r.get('static_reason') or '') or r.get('wrong_at')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", default="smoke", help="smoke, full, or a models-list CSV (harness.zoo.load_zoo)")
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="only the first N causal LMs")
    p.add_argument("--only", default="", help="only ids containing this")
    p.add_argument("--every", type=int, default=1, help="every K-th causal LM (a spread sample)")
    p.add_argument("--shard", default="", help="i/n: only the i-th of n interleaved shares (1-based)")
    p.add_argument("--out", default="", help="JSON-lines file: rows already there are kept, not rerun")
    p.add_argument("--summary", default="", help="only write the summary of every row in --out to this file")
    p.add_argument("--cpu-eager-check", default="", help=argparse.SUPPRESS)  # the child of cpu_eager_check
    p.add_argument("--upto", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_eager_check:
        print(json.dumps(_cpu_eager_loop(args.cpu_eager_check, args.upto, args.max_len, args.batch)), flush=True)
        return 0
    if args.summary:
        text = summary([json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()])
        Path(args.summary).write_text(text + "\n")
        print(text)
        return 0

    import hf_tpu  # noqa: F401
    from harness.zoo import load_zoo, select

    torch.set_float32_matmul_precision("highest")
    entries = [e for e in select(load_zoo(args.zoo), task="causal-lm") if args.only in e.id]
    entries = entries[:: args.every]
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        entries = entries[i - 1:: n]
    if args.limit:
        entries = entries[: args.limit]
    done: dict[str, dict[str, Any]] = {}
    out = Path(args.out) if args.out else None
    if out and out.exists():
        done = {r["id"]: r for r in map(json.loads, out.read_text().splitlines()) if r}
    rows = []
    for e in entries:
        if out and out.exists() and e.id not in done:  # another shard may have written it meanwhile
            done.update({r["id"]: r for r in map(json.loads, out.read_text().splitlines()) if r})
        row = done.get(e.id) or run_model(e, args.max_len, args.batch)
        rows.append(row)
        if out and e.id not in done:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            # one process runs many models: drop this one's graphs and programs before the next
            torch._dynamo.reset()
            gc.collect()
        print(json.dumps({k: row.get(k) for k in ("id", "status", "compilations", "padded_graphs", "static_graphs",
                                                  "worst_abs_err", "seconds")}), flush=True)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
