"""PyTorch's OpInfo database on tpu against CPU: forward and backward, every dtype, eager and compiled.

Used by test_op_parity.py (a deterministic sample in the fast set, the whole database under -m slow), and run
as a script it writes the report grouping failures by cause:

    PYTHONPATH=$PWD nice -n 10 python -m tests.hf_tpu.op_parity [--stride N] [--samples N] [--compiled] [--resume]
        -> reports/op_parity/<eager|compiled>-s<N>.md, and its journal (.jsonl, one line per pair)

It runs the database in child processes of --chunk ops each: a pair that kills its process is recorded as a
failure naming the crash and the run goes on; --resume continues a run from its journal.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: children run `-m tests.hf_tpu.op_parity`
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool, torch.complex64)
GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (rtol, atol) by dtype, the one place tolerances are written: torch.testing.assert_close's defaults, the
# tolerances PyTorch's OpInfo tests apply on CPU unless an op overrides them, except float32/complex64, whose
# 1e-4 allows XLA's transcendental approximations (the previous test's, unchanged).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}
# Ops whose results are not comparable with CPU's by value (uninitialised memory, random draws, sorting ties,
# implementation-defined outputs).
SKIP = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "bernoulli", "multinomial", "normal", "rand_like", "randn_like", "randint_like", "randint", "uniform",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu", "cauchy", "exponential", "geometric",
    "log_normal", "randn", "rand", "argsort", "sort", "unique", "unique_consecutive", "topk", "mode",
    "nonzero_static", "torch.ops.aten._efficient_attention_forward", "resize_", "resize_as_",
    "nn.functional.scaled_dot_product_attention",  # random dropout samples; covered in test_modules
    # draw their _random_samples on the device (another generator than CPU's); test_fractional_pool.py hands
    # both devices CPU's samples
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    # random draws inside the op (OpInfo seeds each call; tpu's generator is not CPU's, docs/device.md): the
    # lowrank SVDs' random projections, and multi_head_attention_forward's dropout (p=0.5, training, in every
    # sample that requires grad). PyTorch's own OpInfo skips test_compare_cpu for them: "output is
    # non-deterministic"
    "svd_lowrank", "pca_lowrank", "nn.functional.multi_head_attention_forward",
}

# Ops whose OpInfo samples hold argument tensors PyTorch requires on CPU for every device (tensor_split's
# tensor_indices_or_sections; its OpInfo builds them on CPU whatever the device): only the input moves to tpu.
CPU_ARGS = {"tensor_split"}

# Ops that read their input's storage outside the input itself (as_strided with a storage_offset; OpInfo's
# partial_views samples are base[5:15] of a 20-element storage, and OpInfo expects test_compare_cpu to fail on
# them). A tensor moved to any device owns a storage of just its elements, and a tpu tensor reports offset 0
# (docs/device.md), so CPU runs these on the same compact input the device gets.
COMPACT_INPUT = {"as_strided"}


class Mismatch(AssertionError):
    """tpu's result differs from CPU's; the message says how (the report's cause)."""


def _to_tpu(x: Any) -> Any:
    return x.detach().to("tpu").requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _cpu(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu" else x


def compare(expected: Any, actual: Any) -> None:
    """Raise Mismatch unless `actual` (from tpu) has CPU's structure, dtypes, shapes and values."""
    e_leaves, a_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    if len(e_leaves) != len(a_leaves):
        raise Mismatch("output structure differs")
    for e, a in zip(e_leaves, a_leaves, strict=True):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch("output is not a tensor")
            a = _cpu(a)
            if e.dtype != a.dtype:
                raise Mismatch(f"dtype differs ({a.dtype} vs CPU's {e.dtype})")
            if e.shape != a.shape:
                raise Mismatch("shape differs")
            e, a = e.detach(), a.detach()
            if e.is_floating_point() or e.is_complex():
                rtol, atol = TOLERANCES.get(e.dtype, TOLERANCES[torch.float32])
                if not torch.allclose(e, a, rtol=rtol, atol=atol, equal_nan=True):
                    raise Mismatch(f"values differ ({e.dtype})")
            elif not torch.equal(e, a):
                raise Mismatch(f"values differ ({e.dtype})")
        elif isinstance(e, float):
            if not (abs(e - a) <= 1e-4 * max(1.0, abs(e)) or (e != e and a != a)):
                raise Mismatch("scalar differs")
        elif e != a:
            raise Mismatch("scalar differs")


def _grad_inputs(args: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor) and x.requires_grad]


def _backward(out: Any, inputs: list[torch.Tensor]) -> list[Any]:
    """Gradients of sum(float outputs * fixed weights) w.r.t. every input that requires grad."""
    outs = [o for o in pytree.tree_leaves(out)
            if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex())]
    if not outs:
        return []
    total = sum((o.real if o.is_complex() else o).float().mul(_weights(o)).sum() for o in outs)
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    return [None if g is None else g for g in grads]


def _weights(o: torch.Tensor) -> torch.Tensor:
    """A fixed, deterministic cotangent (not all ones, so a permuted gradient shows)."""
    n = o.numel()
    return (torch.arange(n, dtype=torch.float32) % 7 / 7 + 0.5).reshape(o.shape).to(o.device)


@dataclass
class Result:
    """(op, dtype) outcome per direction: 'pass', a cause string, or None (not applicable)."""

    forward: str | None = None
    backward: str | None = None


def _cause(exc: BaseException) -> str:
    if isinstance(exc, Mismatch):
        return str(exc)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if " is not supported on tpu: " in msg:  # declared unsupported (errors.Unsupported, docs/device.md)
        return "unsupported: " + msg.split("hf_tpu: ")[-1].split(" is not supported")[0]
    if "no JAX lowering for" in msg:
        return "no lowering: " + msg.split("no JAX lowering for ")[1].split(" ")[0]
    if "failed on tpu" in msg:
        return "lowering raises: " + msg.split(" failed on tpu")[0]
    return f"{type(exc).__name__}: {msg[:100]}"


def check(op: Any, dtype: torch.dtype, samples: int, compiled: bool = False) -> Result:
    """Run `op`'s first `samples` OpInfo samples on CPU and tpu; a direction fails at its first failing sample."""
    grad = dtype in GRAD_DTYPES and op.supports_autograd
    res = Result()
    try:
        cases = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:samples]
    except Exception:
        return res
    fn: Callable[..., Any] = op
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(lambda *a, **k: op(*a, **k), backend="tpu", dynamic=False)
    for s in cases:
        if op.name in COMPACT_INPUT and isinstance(s.input, torch.Tensor):
            s.input = s.input.detach().clone().requires_grad_(s.input.requires_grad)
        try:
            expected = op(s.input, *s.args, **s.kwargs)
            inputs = _grad_inputs((s.input, s.args, s.kwargs)) if grad else []
            e_grads = _backward(expected, inputs) if inputs else []
        except Exception:
            continue  # CPU rejects this sample too
        t_in, t_args, t_kwargs = pytree.tree_map(_to_tpu, (s.input, s.args, s.kwargs))
        if op.name in CPU_ARGS:
            t_args, t_kwargs = s.args, s.kwargs
        try:
            actual = fn(t_in, *t_args, **t_kwargs)
            compare(expected, actual)
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the report
            res.forward = _cause(exc)
            return res
        res.forward = "pass"
        if e_grads:
            try:
                a_grads = _backward(actual, _grad_inputs((t_in, t_args, t_kwargs)))
                compare(e_grads, a_grads)
                res.backward = res.backward or "pass"
            except Exception as exc:  # noqa: BLE001
                res.backward = "backward: " + _cause(exc)
                grad = False
    return res


def ops(stride: int = 1, offset: int = 0) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db[offset::stride] if op.name not in SKIP]


@dataclass
class Tally:
    counts: dict[tuple[str, str], collections.Counter] = field(default_factory=dict)
    causes: collections.Counter = field(default_factory=collections.Counter)
    failing: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    unsupported: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))

    def add(self, name: str, dtype: torch.dtype, res: Result) -> None:
        d = str(dtype).removeprefix("torch.")
        for direction, outcome in (("forward", res.forward), ("backward", res.backward)):
            if outcome is None:
                continue
            c = self.counts.setdefault((direction, d), collections.Counter())
            if _unsupported(outcome):  # counted apart: neither a pass nor a failure
                c["unsupported"] += 1
                self.unsupported[outcome.removeprefix("backward: ")].append(f"{name}:{d}:{direction}")
                continue
            c["pass" if outcome == "pass" else "fail"] += 1
            if outcome != "pass":
                self.causes[outcome] += 1
                self.failing[outcome].append(f"{name}:{d}")

    def total(self, direction: str) -> tuple[int, int]:
        """(pairs passing, pairs run) in `direction`; declared-unsupported pairs are in neither."""
        p = sum(c["pass"] for (dr, _), c in self.counts.items() if dr == direction)
        n = sum(c["pass"] + c["fail"] for (dr, _), c in self.counts.items() if dr == direction)
        return p, n


def _unsupported(outcome: str) -> bool:
    return outcome.removeprefix("backward: ").startswith("unsupported: ")


def pair_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}".rstrip(".")


def sweep(op_list: Iterable[Any], samples: int, compiled: bool = False, dtypes: Iterable[torch.dtype] = DTYPES,
          journal: Journal | None = None) -> Tally:
    """Every (op, dtype) pair CPU supports; with a journal, pairs it holds are skipped and new ones written."""
    warnings.simplefilter("ignore")
    tally = Tally()
    for op in op_list:
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported:
                continue
            name = pair_name(op)
            if journal is not None and journal.done(name, dtype):
                continue
            if journal is not None:
                journal.start(name, dtype)
                if os.environ.get("OP_PARITY_CRASH_AT") == f"{name}:{journal._d(dtype)}":  # the crash test's
                    os.kill(os.getpid(), signal.SIGSEGV)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            res = check(op, dtype, samples, compiled)
            tally.add(name, dtype, res)
            if journal is not None:  # with the pair's cost, so a slow run can be told where its time went
                journal.finish(name, dtype, res, time.process_time() - cpu0, time.perf_counter() - wall0)
    return tally


class Journal:
    """Results of a run, one JSON line per (op, dtype) pair, written as each pair starts and finishes, so a run
    killed or crashed part-way keeps what it measured and names the pair it died in (a start with no finish)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.results: dict[tuple[str, str], Result] = {}
        self.crashed: tuple[str, str] | None = None
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by the crash
                    continue
                key = (rec["op"], rec["dtype"])
                if "forward" in rec:
                    self.results[key] = Result(rec["forward"], rec["backward"])
                    if self.crashed == key:
                        self.crashed = None
                else:
                    self.crashed = key

    @staticmethod
    def _d(dtype: torch.dtype) -> str:
        return str(dtype).removeprefix("torch.")

    def done(self, name: str, dtype: torch.dtype) -> bool:
        return (name, self._d(dtype)) in self.results

    def _write(self, rec: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def start(self, name: str, dtype: torch.dtype) -> None:
        self._write({"op": name, "dtype": self._d(dtype)})

    def finish(self, name: str, dtype: torch.dtype, res: Result, cpu_s: float | None = None,
               wall_s: float | None = None) -> None:
        self.results[(name, self._d(dtype))] = res
        rec = {"op": name, "dtype": self._d(dtype), "forward": res.forward, "backward": res.backward}
        if cpu_s is not None:
            rec |= {"cpu_s": round(cpu_s, 3), "wall_s": round(wall_s or 0.0, 3)}
        self._write(rec)

    def record_crash(self, rc: int) -> None:
        """The pair a child died in fails forward with the crash as its cause (and is not run again)."""
        name, d = self.crashed
        cause = f"process crash (exit {rc})" if rc > 0 else f"process crash (signal {-rc})"
        self.finish(name, getattr(torch, d), Result(cause, None))
        self.crashed = None

    def tally(self) -> Tally:
        """The journal's pairs, less those of ops SKIP holds now (a journal written before an op joined it)."""
        t = Tally()
        for (name, d), res in self.results.items():
            if name not in SKIP and name.rsplit(".", 1)[0] not in SKIP:
                t.add(name, getattr(torch, d), res)
        return t


def run_chunked(journal_path: pathlib.Path, stride: int, samples: int, compiled: bool, chunk: int,
                max_crashes: int = 50) -> Tally:
    """The database in child processes of `chunk` ops each, resuming from the journal: a child that crashes
    costs its one pair (recorded as a failure naming the crash), never the run."""
    op_list = ops(stride)
    crashes = 0
    for lo in range(0, len(op_list), chunk):
        while True:
            cmd = [sys.executable, "-m", "tests.hf_tpu.op_parity", "--child", "--journal", str(journal_path),
                   "--stride", str(stride), "--samples", str(samples), "--first", str(lo), "--count", str(chunk)]
            rc = subprocess.call(cmd + (["--compiled"] if compiled else []), cwd=ROOT)
            if rc == 0:
                break
            journal = Journal(journal_path)
            if journal.crashed is None or crashes >= max_crashes:
                raise RuntimeError(f"op parity child exited {rc} with no pair in progress: {cmd}")
            journal.record_crash(rc)
            crashes += 1
        print(f"ops {lo}-{min(lo + chunk, len(op_list))} of {len(op_list)} done", flush=True)
    return Journal(journal_path).tally()


def markdown(tally: Tally, title: str) -> str:
    lines = [f"# {title}", "", "| direction | dtype | pass | of | % | declared unsupported |", "|---|---|---|---|---|---|"]
    for (direction, d), c in sorted(tally.counts.items()):
        n = c["pass"] + c["fail"]
        lines.append(f"| {direction} | {d} | {c['pass']} | {n} | {100 * c['pass'] / max(n, 1):.1f} | {c['unsupported']} |")
    for direction in ("forward", "backward"):
        p, n = tally.total(direction)
        u = sum(c["unsupported"] for (dr, _), c in tally.counts.items() if dr == direction)
        lines.append(f"| {direction} | all | {p} | {n} | {100 * p / max(n, 1):.1f} | {u} |")
    lines += ["", "## Declared unsupported (docs/device.md), counted apart", "", "| pairs | op | (op, dtype, direction) |",
              "|---|---|---|"]
    for cause, pairs in sorted(tally.unsupported.items()):
        lines.append(f"| {len(pairs)} | {cause} | {' '.join(pairs[:12])} |")
    lines += ["", "## Failures by cause", "", "| pairs | cause | (op, dtype) |", "|---|---|---|"]
    for cause, n in tally.causes.most_common():
        lines.append(f"| {n} | {cause.replace('|', '/')} | {' '.join(tally.failing[cause][:12])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--samples", type=int, default=int(os.environ.get("HF_TPU_OPINFO_SAMPLES", "2")))
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--chunk", type=int, default=40, help="ops per child process")
    ap.add_argument("--resume", action="store_true", help="keep the journal's results, run the pairs it lacks")
    ap.add_argument("--out", default=None, help="default reports/op_parity/<eager|compiled>-s<stride>.md")
    ap.add_argument("--journal", default=None, help="default: --out's path with .jsonl")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    mode = "compiled" if a.compiled else "eager"
    out = pathlib.Path(a.out or f"reports/op_parity/{mode}-s{a.stride}.md")
    journal_path = pathlib.Path(a.journal) if a.journal else out.with_suffix(".jsonl")
    if a.child:
        import hf_tpu

        hf_tpu.set_matmul_precision("highest")
        sweep(ops(a.stride)[a.first:a.first + a.count], a.samples, a.compiled, journal=Journal(journal_path))
        return
    if not a.resume and journal_path.exists():
        journal_path.unlink()
    tally = run_chunked(journal_path, a.stride, a.samples, a.compiled, a.chunk)
    text = markdown(tally, f"OpInfo parity on tpu ({mode}, every {a.stride} op, {a.samples} samples)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
