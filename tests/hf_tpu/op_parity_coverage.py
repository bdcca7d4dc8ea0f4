"""Every ATen op of a few zoo models' training step on tpu, checked against the OpInfo parity database.

    PYTHONPATH=$PWD nice -n 10 python -m tests.hf_tpu.op_parity_coverage zoo [entry ...]
        -> reports/op_parity/zoo-train-ops.json: each ATen op dispatched on tpu by one eager training step
           (forward, backward, AdamW as the sweep's) of each zoo entry, with its count
    PYTHONPATH=$PWD nice -n 10 python -m tests.hf_tpu.op_parity_coverage db [--resume]
        -> reports/op_parity/db-aten-ops.jsonl: per OpInfo (op, dtype) pair, the ATen ops its float32 samples
           dispatch (forward and backward, first 2 samples, as the parity run); OpInfo ops whose names match a
           zoo op are recorded first, so a partial run already answers for the zoo's ops
    PYTHONPATH=$PWD python -m tests.hf_tpu.op_parity_coverage report
        -> reports/op_parity/zoo-train-ops.md: each zoo op, how the device runs it (op_table's lowering
           column), the OpInfo pairs that dispatch it and their results in the eager and compiled parity journals

The database's ops are recorded on CPU (a TorchDispatchMode): below autograd the ops are the device's own
except the backward PyTorch chooses per device, which is `<op>_overrideable` for a PrivateUse1 device
(convolution's); names are compared with that suffix dropped.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tests.hf_tpu import op_parity

REPORTS = op_parity.ROOT / "reports" / "op_parity"
DB_OPS = REPORTS / "db-aten-ops.jsonl"
ZOO_OPS = REPORTS / "zoo-train-ops.json"
# Zoo entries whose training step is checked: a decoder LM, an encoder, a vision transformer, a CNN, seq2seq.
ZOO = ("transformers/llama/LlamaForCausalLM", "transformers/bert/BertForSequenceClassification",
       "transformers/vit/ViTForImageClassification", "transformers/resnet/ResNetForImageClassification",
       "transformers/t5/T5ForConditionalGeneration")


def normal_name(op: Any) -> str:
    """`aten::name.overload`, with PyTorch's PrivateUse1 backward names (`*_overrideable`) as CPU's."""
    from hf_tpu.errors import op_name

    return op_name(op).replace("_overrideable", "")


class _Record(TorchDispatchMode):
    def __init__(self, seen: set[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.seen.add(normal_name(func))
        return func(*args, **(kwargs or {}))


def record_pair(op: Any, samples: int = 2) -> tuple[str, list[str]] | None:
    """(pair name, the ATen ops its first `samples` samples dispatch on CPU) for float32 (else the op's first
    supported dtype of the parity run), forward and, where the op has autograd, backward; None if it has none."""
    supported = op.supported_dtypes("cpu")
    dtype = next((d for d in op_parity.DTYPES if d in supported), None)
    if dtype is None:
        return None
    grad = dtype in op_parity.GRAD_DTYPES and op.supports_autograd
    seen: set[str] = set()
    try:
        cases = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:samples]
    except Exception:  # noqa: BLE001 - the parity run skips such ops too
        return None
    for s in cases:
        try:
            with _Record(seen):
                res = op(s.input, *s.args, **s.kwargs)
                inputs = op_parity._grad_inputs((s.input, s.args, s.kwargs)) if grad else []
                if inputs:
                    op_parity._backward(res, inputs)
        except Exception:  # noqa: BLE001 - CPU rejects the sample: the parity run skips it
            continue
    return f"{op_parity.pair_name(op)}:{str(dtype).removeprefix('torch.')}", sorted(seen)


def _base(name: str) -> str:
    """`aten::_log_softmax_backward_data.default` -> `log_softmax`: the name an OpInfo would carry."""
    base = name.split("::")[-1].split(".")[0].strip("_")
    for suffix in ("_backward_data", "_backward", "_forward", "_overrideable"):
        base = base.removesuffix(suffix)
    return base.removeprefix("native_").removeprefix("fused_")


def record_db(op_list: list[Any], path: pathlib.Path, resume: bool, first: set[str]) -> None:
    """Records every op's pair into the journal `path` (one JSON line per OpInfo op), those whose name's last
    part is in `first` before the rest."""
    warnings.simplefilter("ignore")
    done = set()
    if resume and path.exists():
        done = {json.loads(line)["opinfo"] for line in path.read_text().splitlines() if line.strip()}
    elif path.exists():
        path.unlink()
    def near(o: Any) -> int:  # 0: the zoo op's own name, 1: a related name (conv2d for convolution), 2: the rest
        last = o.name.split(".")[-1].strip("_")
        if last in first:
            return 0
        return 1 if any(b.startswith(last) or last.startswith(b[:4]) for b in first if len(b) >= 3) else 2

    order = sorted(op_list, key=near)
    for op in order:
        key = op_parity.pair_name(op)
        if key in done:
            continue
        rec = record_pair(op)
        with path.open("a") as f:
            f.write(json.dumps({"opinfo": key, "pair": rec[0] if rec else None, "ops": rec[1] if rec else []}) + "\n")


def db_table(path: pathlib.Path = DB_OPS) -> dict[str, list[str]]:
    """ATen op -> the recorded pairs that dispatch it."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for name in rec["ops"]:
                out[name].append(rec["pair"])
    return dict(out)


def train_step_ops(entry_id: str) -> dict[str, int]:
    """ATen op -> times dispatched on tpu by one eager training step of the zoo entry (AdamW as the sweep's)."""
    from harness.sweep import train
    from harness.zoo import load_zoo

    from hf_tpu import hooks

    entry = next(e for e in load_zoo("full") if e.id == entry_id)
    built = entry.build(seed=0)
    counts: collections.Counter = collections.Counter()

    def record(dispatch: Callable[..., Any], op: Any, args: tuple, kwargs: dict) -> Any:
        counts[normal_name(op)] += 1
        return dispatch(op, args, kwargs)

    with hooks.observe_ops(record):
        train.run_steps(built, entry, "tpu", 1)
    return dict(counts)


def route(name: str) -> str:
    """How the device runs the op: op_table's lowering column, or, for in-place and view ops run through
    their functional op, that op's."""
    from hf_tpu import functionalize, op_registry, op_table
    from hf_tpu.torchax_compat import load_op_table

    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), base, None)
    candidates = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    op = next((o for o in candidates if (o._overloadname or "default") == overload), None)
    if op is None:
        return "unknown op"
    kinds = tuple(k for k in op_registry.KINDS if op in op_registry.table(k))
    how = op_table._lowering(op, kinds, load_op_table()[0])
    if how == "none":
        kind = functionalize.kind(op)
        if kind == "view" or torch.Tag.inplace_view in op.tags:
            return "view (views.py)"
        func = functionalize.functional_of(op) if kind != "functional" else None
        if isinstance(func, torch._ops.OpOverload):
            return f"via {normal_name(func)}: " + route(normal_name(func))
    return how


def _journal(path: pathlib.Path) -> dict[str, op_parity.Result]:
    if not path.exists():
        return {}
    j = op_parity.Journal(path)
    return {f"{name}:{d}": res for (name, d), res in j.results.items()}


def eager_journal() -> dict[str, op_parity.Result]:
    """The newest whole-database eager results: eager-s1-run2 (one complete run on one code, 2026-12-07), else
    the older composites (failing pairs rerun on top of earlier runs)."""
    for name in ("eager-s1-run2.jsonl", "eager-s1-session5.jsonl", "eager-s1-after.jsonl", "eager-s1.jsonl"):
        j = _journal(REPORTS / name)
        if j:
            return j
    return {}


def _status(pairs: list[str], journal: dict[str, op_parity.Result]) -> str:
    """'pass' if every listed pair the journal holds passed both directions, else the failing pairs; declared
    unsupported pairs (the sparse ops) are counted apart, as in the parity report."""
    ran = [p for p in pairs if p in journal and not op_parity._unsupported(journal[p].forward)]
    if not ran:
        return "not run"
    bad = [p for p in ran if journal[p].forward != "pass" or journal[p].backward not in (None, "pass")]
    return "pass" if not bad else "fail: " + " ".join(bad[:3])


def zoo_report(per_entry: dict[str, dict[str, int]]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown report and its rows (one per op of any entry's step), from the recorded tables."""
    db = db_table()
    recorded = sum(1 for _ in DB_OPS.open()) if DB_OPS.exists() else 0
    eager = eager_journal()
    compiled = _journal(REPORTS / "compiled-s1-run3.jsonl") or _journal(REPORTS / "compiled-s1.jsonl")  # complete, one code
    ops = sorted({op for c in per_entry.values() for op in c})
    rows = []
    for op in ops:
        pairs = db.get(op, [])
        rows.append({"op": op, "entries": [e.split("/")[-1] for e, c in per_entry.items() if op in c],
                     "route": route(op), "pairs": pairs, "eager": _status(pairs, eager) if pairs else "",
                     "compiled": _status(pairs, compiled) if pairs else ""})
    covered = [r for r in rows if r["pairs"]]
    lines = ["# Every ATen op of a zoo training step on tpu, against the OpInfo parity database", "",
             f"Entries (one eager step each: forward, backward, AdamW): {', '.join(per_entry)}", "",
             f"{len(rows)} ops; {len(covered)} dispatched by some OpInfo pair's float32 samples, "
             f"{len(rows) - len(covered)} by none (listed first). OpInfo ops recorded: {recorded} of "
             f"{len(op_parity.ops(1))}.", "",
             "| op | lowering | covering OpInfo pairs | eager parity | compiled parity | entries |",
             "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (bool(r["pairs"]), r["op"])):
        pairs = " ".join(r["pairs"][:4]) + (f" (+{len(r['pairs']) - 4})" if len(r["pairs"]) > 4 else "")
        lines.append(f"| {r['op']} | {r['route']} | {pairs or '**none**'} | {r['eager']} | {r['compiled']} | "
                     f"{', '.join(r['entries'])} |")
    return "\n".join(lines) + "\n", rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("zoo", "db", "report"))
    ap.add_argument("entries", nargs="*", default=list(ZOO))
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "db":
        zoo = json.loads(ZOO_OPS.read_text()) if ZOO_OPS.exists() else {}
        first = {_base(op) for ops in zoo.values() for op in ops}
        record_db(op_parity.ops(1), DB_OPS, a.resume, first)
        return
    if a.what == "zoo":
        import hf_tpu

        hf_tpu.set_matmul_precision("highest")
        table = json.loads(ZOO_OPS.read_text()) if ZOO_OPS.exists() else {}
        for e in a.entries:
            table[e] = dict(sorted(train_step_ops(e).items()))
            ZOO_OPS.write_text(json.dumps(table, indent=1) + "\n")
            print(f"{e}: {len(table[e])} ops", flush=True)
        return
    text, _ = zoo_report(json.loads(ZOO_OPS.read_text()))
    (REPORTS / "zoo-train-ops.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
