"""Op level: record the ATen ops a module runs (a TorchDispatchMode), replay each on `tpu` with the same inputs,
compare, and describe tensors (shape, dtype, value range) for reports and repro scripts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.sweep import numerics
from hf_tpu.lowering import op_name  # noqa: F401 - the spelling hf_tpu's errors use; re-exported here

Tolerance = numerics.Tolerance


# ------------------------------------------------------------------------------------------- tensor specs
@dataclass
class TensorSpec:
    """What a repro needs to build a look-alike input: shape, dtype and the value range."""

    shape: list[int]
    dtype: str  # "float32", "int64", ...
    min: float = 0.0
    max: float = 0.0
    mean: float = 0.0
    std: float = 0.0
    values: list | None = None  # small integer/bool tensors (indices, masks) are kept exactly

    def short(self) -> str:
        return f"{self.dtype}{list(self.shape)}"

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        spec = cls(shape=list(t.shape), dtype=str(t.dtype).replace("torch.", ""))
        if t.numel() == 0 or t.is_complex():
            return spec
        v = t.double() if t.dtype != torch.bool else t.to(torch.int64).double()
        finite = v[torch.isfinite(v)]
        if finite.numel():
            spec.min, spec.max = float(finite.min()), float(finite.max())
            spec.mean = float(finite.mean())
            spec.std = float(finite.std()) if finite.numel() > 1 else 0.0
        if not t.is_floating_point() and t.numel() <= 64:
            spec.values = t.tolist()
        return spec


def describe(x: Any) -> Any:
    """A JSON-able description of an op argument: TensorSpec for tensors, repr for the rest."""
    if isinstance(x, torch.Tensor):
        return TensorSpec.of(x)
    if isinstance(x, (list, tuple)):
        return [describe(v) for v in x]
    return x


def spec_text(x: Any) -> str:
    if isinstance(x, TensorSpec):
        return x.short()
    if isinstance(x, list):
        return "[" + ", ".join(spec_text(v) for v in x) + "]"
    return repr(x)


# ------------------------------------------------------------------------------------------ tree helpers
def map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)({k: map_tensors(v, fn) for k, v in obj.items()}) if type(obj) is dict else {
            k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def clone_cpu(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.detach().to("cpu", copy=True))


def to_device(obj: Any, device: str) -> Any:
    return map_tensors(obj, lambda t: t.detach().clone().to(device))


def flat_tensors(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in a nest of tuples, lists, dicts, ModelOutputs and dataclasses."""
    out: list[tuple[str, torch.Tensor]] = []
    if obj is None or depth > 6:
        return out
    if isinstance(obj, torch.Tensor):
        return [(prefix or "out", obj)]
    if isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, str)):
        try:
            keys = list(obj.keys())
        except Exception:  # noqa: BLE001
            return out
        for k in keys:
            out += flat_tensors(obj[k], f"{prefix}.{k}" if prefix else str(k), depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += flat_tensors(v, f"{prefix}.{i}" if prefix else str(i), depth + 1)
        return out
    if hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            out += flat_tensors(getattr(obj, name, None), f"{prefix}.{name}" if prefix else name, depth + 1)
    return out


# ------------------------------------------------------------------------------------------- comparison
@dataclass
class TensorDiff:
    name: str
    match: bool
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    cosine: float = math.nan
    reason: str = ""
    ref: TensorSpec | None = None
    res: TensorSpec | None = None


def compare(name: str, ref: torch.Tensor, res: torch.Tensor, fp64: torch.Tensor | None, tol: Tolerance) -> TensorDiff:
    """One tensor, by the sweep's rule (harness.sweep.numerics.compare_tensor); integer tensors must be equal."""
    ref, res = ref.detach().cpu(), res.detach().cpu()
    if tuple(ref.shape) != tuple(res.shape):
        return TensorDiff(name, False, reason=f"{name}: shape {tuple(res.shape)} != cpu {tuple(ref.shape)}",
                          ref=TensorSpec.of(ref), res=TensorSpec.of(res))
    if not (ref.is_floating_point() or ref.is_complex()):
        if res.dtype != ref.dtype:
            res = res.to(ref.dtype)
        ok = torch.equal(ref, res)
        err = 0.0 if ok else float((ref.double() - res.double()).abs().max())
        return TensorDiff(name, ok, err, err, reason="" if ok else f"{name}: integer values differ (max {err:g})")
    if ref.is_complex():
        # resolve_conj: view_as_real refuses a lazily conjugated tensor (what `x.conj()` returns, e.g. in
        # Autoformer's FFT autocorrelation)
        ref, res = torch.view_as_real(ref.resolve_conj()), torch.view_as_real(res.to(ref.dtype).resolve_conj())
        fp64 = torch.view_as_real(fp64.resolve_conj()) if fp64 is not None and fp64.is_complex() else None
    if fp64 is not None and (tuple(fp64.shape) != tuple(ref.shape) or not fp64.is_floating_point()):
        fp64 = None
    ok, m, reason = numerics.compare_tensor(name, ref, res.to(ref.dtype), fp64, tol)
    return TensorDiff(name, ok, m.get("max_abs_err", math.nan), m.get("max_rel_err", math.nan),
                      m.get("cosine", math.nan), reason)


def compare_trees(ref: Any, res: Any, fp64: Any, tol: Tolerance) -> list[TensorDiff]:
    """Compare every tensor of two nests (same structure expected); a structure mismatch is one failed diff."""
    a, b = flat_tensors(ref), flat_tensors(res)
    c = dict(flat_tensors(fp64)) if fp64 is not None else {}
    if [k for k, _ in a] != [k for k, _ in b]:
        return [TensorDiff("structure", False, reason=f"outputs differ in structure: cpu {[k for k, _ in a][:6]} "
                                                      f"vs tpu {[k for k, _ in b][:6]}")]
    return [compare(k, x, y, c.get(k), tol) for (k, x), (_, y) in zip(a, b, strict=True)]


# ----------------------------------------------------------------------------------------- op recording
@dataclass
class OpCall:
    index: int
    op: Any
    args: tuple
    kwargs: dict
    out: Any = None
    module: str = ""
    error: BaseException | None = None

    @property
    def name(self) -> str:
        return op_name(self.op)


class ModuleStack:
    """The module path currently running: forward pre-hooks push, forward hooks pop (an exception leaves
    the innermost module on top, which is what a failure report wants)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.handles: list[Any] = []

    def attach(self, modules: list[tuple[str, torch.nn.Module]]) -> ModuleStack:
        for name, mod in modules:
            self.handles.append(mod.register_forward_pre_hook(lambda m, a, _n=name: self.stack.append(_n)))
            self.handles.append(mod.register_forward_hook(lambda m, a, o, _n=name: self._pop(_n)))
        return self

    def _pop(self, name: str) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()
        elif name in self.stack:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(name):]

    def top(self) -> str:
        return self.stack[-1] if self.stack else ""

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


_SKIP_REPLAY = {"aten::detach.default", "aten::lift_fresh.default", "aten::_local_scalar_dense.default"}
# ops whose output is uninitialised memory: any two runs differ, so comparing them locates nothing (an
# `empty` that a model then fills was once reported as the op that diverged)
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


class RecordOps(TorchDispatchMode):
    """Record every ATen op with CPU copies of its inputs (keep=True) or only the op that raises.

    With `stack`, each call notes the module that made it. On an exception the failing call is kept in
    `.failed` (the outermost op seen by the mode; the exception's `.op` may name an inner op of its
    decomposition) and the exception goes on."""

    def __init__(self, keep: bool = True, stack: ModuleStack | None = None, limit: int = 20000) -> None:
        super().__init__()
        self.keep = keep
        self.stack = stack
        self.limit = limit
        self.calls: list[OpCall] = []
        self.failed: OpCall | None = None
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.count += 1
        module = self.stack.top() if self.stack else ""
        keep = self.keep and len(self.calls) < self.limit
        inputs = (clone_cpu(args), clone_cpu(kwargs)) if keep else None  # before an in-place op changes them
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            if self.failed is None:
                self.failed = OpCall(self.count, func, clone_cpu(args), clone_cpu(kwargs), module=module, error=exc)
            raise
        if keep:
            self.calls.append(OpCall(self.count, func, inputs[0], inputs[1], clone_cpu(out), module))
        return out


@dataclass
class OpResult:
    call: OpCall
    diffs: list[TensorDiff] = field(default_factory=list)
    error: str = ""  # replay on tpu raised
    skipped: str = ""

    @property
    def match(self) -> bool:
        return not self.error and not self.skipped and all(d.match for d in self.diffs)


def _double(x: Any) -> Any:
    return map_tensors(x, lambda t: t.double() if t.is_floating_point() else t)


def _is_random(op: Any) -> bool:
    tags = getattr(op, "tags", ()) or ()
    return torch.Tag.nondeterministic_seeded in tags


def not_comparable(op: Any) -> str:
    """Why `op`'s output values tell nothing of its lowering ('' when they do): a random draw, or
    uninitialised memory (any two runs differ)."""
    if _is_random(op):
        return "random op"
    return "uninitialised output" if op._schema.name.split("::")[-1] in _UNINITIALISED else ""


def replay(call: OpCall, device: str, tol: Tolerance) -> OpResult:
    """Run one recorded op on `device` with the recorded inputs; compare with the recorded CPU output."""
    name = call.name
    if name in _SKIP_REPLAY or _is_random(call.op):
        return OpResult(call, skipped="random or bookkeeping op")
    if not_comparable(call.op):
        return OpResult(call, skipped="uninitialised output")
    if not flat_tensors(call.out):
        return OpResult(call, skipped="no tensor output")
    try:
        out = call.op(*to_device(call.args, device), **to_device(call.kwargs, device))
        out = clone_cpu(out)
    except Exception as exc:  # noqa: BLE001
        return OpResult(call, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    fp64 = None
    try:
        fp64 = call.op(*_double(call.args), **_double(call.kwargs))
    except Exception:  # noqa: BLE001  (no float64 kernel, or dtype arguments: allclose alone decides)
        fp64 = None
    return OpResult(call, diffs=compare_trees(call.out, out, fp64, tol))


class FailureProbe:
    """Keep the first ATen op that raises on `tpu`, with CPU copies of its inputs and the calling module.

    Under hf_tpu this observes the eager backend's entry point (hf_tpu.hooks.observe_ops) and changes nothing
    else: a TorchDispatchMode would (it makes some Python-level tensor code, e.g. torch.tensor() of a list of
    0-d tpu tensors, take another path). The innermost failing op is kept, the one the exception names. Other
    backends (torch_tpu) get the dispatch mode (RecordOps)."""

    def __init__(self, stack: ModuleStack | None = None) -> None:
        self.stack = stack
        self.failed: OpCall | None = None
        self._busy = False
        self._mode: RecordOps | None = None
        self._observing: Any = None

    def _record(self, op: Any, args: tuple, kwargs: dict, exc: BaseException) -> None:
        if self.failed is not None or self._busy:
            return
        self._busy = True
        module = self.stack.top() if self.stack else ""
        try:
            self.failed = OpCall(0, op, clone_cpu(args), clone_cpu(kwargs), module=module, error=exc)
        except Exception:  # noqa: BLE001  (inputs that cannot be copied: the op and module still count)
            self.failed = OpCall(0, op, (), {}, module=module, error=exc)
        finally:
            self._busy = False

    def __enter__(self) -> FailureProbe:
        try:
            from hf_tpu import device as hdev
            from hf_tpu import hooks

            if not hdev.is_registered():
                raise ImportError
        except ImportError:
            self._mode = RecordOps(keep=False, stack=self.stack)
            self._mode.__enter__()
            return self
        def record(dispatch, op, args, kwargs):
            try:
                return dispatch(op, args, kwargs)
            except Exception as exc:
                self._record(op, args, kwargs, exc)
                raise

        self._observing = hooks.observe_ops(record)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc_info)
            self.failed = self._mode.failed
        elif self._observing is not None:
            self._observing.__exit__(*exc_info)


DISCONTINUOUS = {"eq", "ne", "gt", "ge", "lt", "le", "argmax", "argmin", "topk", "sort", "argsort", "nonzero",
                 "max", "min", "round", "floor", "ceil", "trunc", "sign", "where", "masked_select", "unique",
                 "_unique2", "searchsorted", "bucketize", "index", "gather"}


def is_discontinuous(name: str) -> bool:
    """Ops whose result jumps on a tiny input change (comparisons, selections, rounding)."""
    base = name.split("::", 1)[-1].split(".", 1)[0].rstrip("_")
    return base in DISCONTINUOUS


@dataclass
class Misalignment:
    index: int
    cpu: OpCall
    tpu: OpCall | None
    kind: str  # path (another op runs on tpu) | differs (the op's result differs in the module run)
    diffs: list[TensorDiff] = field(default_factory=list)
    input_diffs: list[TensorDiff] = field(default_factory=list)

    @property
    def inputs_agree(self) -> bool:
        return all(d.match for d in self.input_diffs)


_LAYOUT = {"clone", "_to_copy", "copy", "contiguous", "reshape", "_reshape_alias", "_unsafe_view", "empty_like",
           "empty", "empty_strided", "lift_fresh", "detach", "zeros_like", "resize", "new_empty", "new_empty_strided"}


def _layout_only(call: OpCall) -> bool:
    """Copies, views and allocations: backends differ in how many they need (a reshape is a view on one, a
    clone plus a view on another), so runs are aligned on the ops that compute."""
    if call.name in _SKIP_REPLAY:
        return True
    base = call.name.split("::", 1)[-1].split(".", 1)[0].rstrip("_")
    if base in _LAYOUT:
        return True
    rets = getattr(getattr(call.op, "_schema", None), "returns", None) or []
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _only_tie_indices(out: Any, diffs: list[TensorDiff]) -> bool:
    """Only integer outputs differ while the op's floating outputs agree: indices picked among near-equal values."""
    kinds = {name: t.is_floating_point() for name, t in flat_tensors(out)}
    bad = [d for d in diffs if not d.match]
    return bool(bad) and all(not kinds.get(d.name, True) for d in bad) and any(
        kinds.get(d.name, False) and d.match for d in diffs)


def align(cpu_calls: list[OpCall], tpu_calls: list[OpCall], tol: Tolerance) -> Misalignment | None:
    """Walk the ops of the same module run on CPU and on tpu side by side: the first op that is not the same
    op, or whose result differs (with its inputs compared too)."""
    a = [c for c in cpu_calls if not _layout_only(c)]
    b = [c for c in tpu_calls if not _layout_only(c)]
    for i, (c, t) in enumerate(zip(a, b, strict=False)):
        if c.name != t.name:
            return Misalignment(i, c, t, "path")
        if _is_random(c.op):
            continue
        diffs = compare_trees(c.out, t.out, None, tol)
        if not all(d.match for d in diffs):
            ins = compare_trees((c.args, c.kwargs), (t.args, t.kwargs), None, tol)
            if all(d.match for d in ins) and _only_tie_indices(c.out, diffs):
                continue  # e.g. max_pool's indices under near-ties, next to values that agree
            return Misalignment(i, c, t, "differs", diffs, ins)
    if len(a) != len(b):
        i = min(len(a), len(b))
        return Misalignment(i, a[i] if i < len(a) else b[i], b[i] if i < len(b) else None, "path")
    return None
