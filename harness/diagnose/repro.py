"""Standalone repro scripts: a few lines that build an op's (or module's) inputs, run them on CPU and `tpu`,
print the difference or the error, and exit 1 when the failure reproduces (0 when `tpu` agrees, 2 when the CPU
run itself fails). Op inputs are random with the recorded shapes, dtypes and value ranges (fixed seed); small
integer tensors (indices, masks) keep their recorded values."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from harness.diagnose.ops import TensorSpec, describe

_HEADER = '''#!/usr/bin/env python
"""hf-tpu diagnose repro: {title}
{context}
Run: python {filename}   (exit 1: reproduced; 0: tpu agrees with CPU; 2: the CPU run fails too)"""
import sys

import torch

import hf_tpu  # noqa: F401  (the tpu device; `import torch` alone also registers it)
from hf_tpu.precision import cpu_reference  # the CPU side in IEEE float32 on any host (AMX or not)

MODE = {mode!r}  # eager: the op runs through hf_tpu's dispatch; compiled: inside torch.compile(backend="tpu")
TOL = {tol!r}  # the sweep's allclose tolerance for precision {precision!r}, dtype {dtype!r}
torch.manual_seed(0)
hf_tpu.set_matmul_precision({precision!r})


def t(shape, dtype, lo=0.0, hi=1.0, mean=0.0, std=1.0, values=None):
    """A random tensor like the recorded one (same shape, dtype and value range)."""
    if values is not None:
        return torch.tensor(values, dtype=dtype).reshape(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool() if hi > lo else torch.full(shape, bool(hi), dtype=torch.bool)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64) * std + mean).clamp(lo, hi).to(dtype)
    return torch.randint(int(lo), int(hi) + 1, shape).to(dtype)


def on(device, x):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {{k: on(device, v) for k, v in x.items()}}
    if isinstance(x, (list, tuple)):
        return type(x)(on(device, v) for v in x)
    return x


def tensors(x, name="out"):
    if isinstance(x, torch.Tensor):
        return [(name, x)]
    if isinstance(x, dict) or hasattr(x, "keys"):
        return [p for k in x.keys() for p in tensors(x[k], f"{{name}}.{{k}}")]
    if isinstance(x, (list, tuple)):
        return [p for i, v in enumerate(x) for p in tensors(v, f"{{name}}.{{i}}")]
    return []


def check(ref, res):
    bad = 0
    for (name, a), (_, b) in zip(tensors(ref), tensors(res)):
        b = b.detach().cpu()
        if a.shape != b.shape:
            print(f"{{name}}: shape {{tuple(b.shape)}} on tpu != {{tuple(a.shape)}} on cpu")
            bad += 1
        elif a.is_floating_point():
            err = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0
            ok = torch.allclose(a, b.to(a.dtype), atol=TOL, rtol=TOL, equal_nan=True)
            print(f"{{name}}: {{a.dtype}}{{list(a.shape)}} max abs err {{err:.3g}} (tol {{TOL:g}})" + ("" if ok else "  <-- DIFFERS"))
            bad += not ok
        elif not torch.equal(a, b.to(a.dtype)):
            print(f"{{name}}: {{a.dtype}}{{list(a.shape)}} values differ")
            bad += 1
    return bad
'''

_OP_BODY = '''

op = torch.ops.{op_attr}
args = {args}
kwargs = {kwargs}
try:
    with cpu_reference():
        ref = op(*args, **kwargs)
except Exception as exc:
    print(f"the CPU run fails too: {{type(exc).__name__}}: {{exc}}")
    sys.exit(2)
try:
    if MODE == "compiled":
        res = torch.compile(lambda *a, **k: op(*a, **k), backend="tpu", dynamic=False)(*on("tpu", args), **on("tpu", kwargs))
    else:
        res = op(*on("tpu", args), **on("tpu", kwargs))
    res = on("cpu", res)
except Exception as exc:
    print(f"REPRODUCED: {{op}} raises on tpu ({{MODE}}): {{type(exc).__name__}}: {{str(exc).splitlines()[0] if str(exc) else ''}}")
    sys.exit(1)
if check(ref, res):
    print(f"REPRODUCED: {{op}} on tpu ({{MODE}}) differs from CPU on the same inputs")
    sys.exit(1)
print(f"not reproduced: {{op}} on tpu ({{MODE}}) agrees with CPU")
'''

_MODULE_BODY = '''
import copy
from pathlib import Path

saved = torch.load(Path(__file__).with_name({pt_name!r}), weights_only=False)  # the module and its recorded inputs
module, args, kwargs = saved["module"].eval(), saved["args"], saved["kwargs"]
with torch.no_grad():
    try:
        with cpu_reference():
            ref = module(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    except Exception as exc:
        print(f"the CPU run fails too: {{type(exc).__name__}}: {{exc}}")
        sys.exit(2)
    try:
        mod = copy.deepcopy(module).to("tpu")
        if MODE == "compiled":
            mod = torch.compile(mod, backend="tpu", dynamic=False)
        res = on("cpu", mod(*on("tpu", args), **on("tpu", kwargs)))
    except Exception as exc:
        print(f"REPRODUCED: {{type(module).__name__}} raises on tpu ({{MODE}}): {{type(exc).__name__}}: {{str(exc).splitlines()[0] if str(exc) else ''}}")
        sys.exit(1)
if check(ref, res):
    print(f"REPRODUCED: {{type(module).__name__}} on tpu ({{MODE}}) differs from CPU on the same inputs")
    sys.exit(1)
print(f"not reproduced: {{type(module).__name__}} on tpu ({{MODE}}) agrees with CPU")
'''


def py(x: Any) -> str:
    """Python source for an op argument (TensorSpec -> a `t(...)` call)."""
    if isinstance(x, TensorSpec):
        dt = f"torch.{x.dtype}"
        shape = tuple(x.shape)
        if x.values is not None:
            return f"t({shape}, {dt}, values={x.values!r})"
        return f"t({shape}, {dt}, lo={_num(x.min)}, hi={_num(x.max)}, mean={_num(x.mean)}, std={_num(x.std)})"
    if isinstance(x, torch.Tensor):
        return py(TensorSpec.of(x))
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return repr(x)
    if isinstance(x, float):
        return _num(x)
    if isinstance(x, torch.device):
        return f"torch.device({str(x)!r})"
    if isinstance(x, (torch.dtype, torch.memory_format, torch.layout)):
        return f"torch.{str(x).replace('torch.', '')}"
    if isinstance(x, list):
        return "[" + ", ".join(py(v) for v in x) + "]"
    if isinstance(x, tuple):
        return "(" + ", ".join(py(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {py(v)}" for k, v in x.items()) + "}"
    raise ValueError(f"cannot write {type(x).__name__} into a repro")


def _num(v: float) -> str:
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(float(v))


def _context(entry_id: str, module: str, module_class: str, summary: str) -> str:
    lines = [f"Entry: {entry_id}"]
    if module:
        lines.append(f"Module: {module} ({module_class})" if module_class else f"Module: {module}")
    if summary:
        lines.append(f"Found: {summary}")
    return "\n".join(lines)


def write_op_repro(path: Path, op: Any, args: Any, kwargs: dict, *, mode: str, tol: float, precision: str, dtype: str,
                   entry_id: str = "", module: str = "", module_class: str = "", summary: str = "") -> Path:
    from harness.diagnose.ops import op_name

    name = op_name(op)
    ns, rest = name.split("::", 1)
    body = _OP_BODY.format(op_attr=f"{ns}.{rest}", args=py(list(describe(list(args)))),
                           kwargs=py({k: describe(v) for k, v in kwargs.items()}))
    head = _HEADER.format(title=f"{name} ({mode})", context=_context(entry_id, module, module_class, summary),
                          filename=path.name, mode=mode, tol=tol, precision=precision, dtype=dtype)
    path.write_text(head + body)
    return path


def write_module_repro(path: Path, module: torch.nn.Module, args: tuple, kwargs: dict, *, mode: str, tol: float,
                       precision: str, dtype: str, entry_id: str = "", module_name: str = "",
                       summary: str = "") -> Path:
    pt = path.with_suffix(".pt")
    torch.save({"module": module, "args": args, "kwargs": kwargs}, pt)
    head = _HEADER.format(title=f"module {module_name or type(module).__name__} ({mode})",
                          context=_context(entry_id, module_name, type(module).__name__, summary),
                          filename=path.name, mode=mode, tol=tol, precision=precision, dtype=dtype)
    path.write_text(head + _MODULE_BODY.format(pt_name=pt.name))
    return path


_ENTRY_BODY = """
from harness.diagnose.core import find_entry
from harness.entry_calls import output_tensors, prepare_inputs, prepare_model

ENTRY = {entry_id!r}
built = find_entry(ENTRY).build(seed=0)  # the zoo entry, rebuilt: same weights and inputs on CPU and tpu
with torch.no_grad():
    try:
        torch.manual_seed(0)
        ref = output_tensors(built.call(prepare_model(built.model), prepare_inputs(built.inputs)))
    except Exception as exc:
        print(f"the CPU run fails too: {{type(exc).__name__}}: {{exc}}")
        sys.exit(2)
    try:
        fn = torch.compile(built.call, backend="tpu", dynamic=False) if MODE == "compiled" else built.call
        torch.manual_seed(0)
        res = on("cpu", output_tensors(fn(prepare_model(built.model, "tpu"), prepare_inputs(built.inputs, "tpu"))))
    except Exception as exc:
        print(f"REPRODUCED: {{ENTRY}} raises on tpu ({{MODE}}): {{type(exc).__name__}}: {{str(exc).splitlines()[0] if str(exc) else ''}}")
        sys.exit(1)
if check(ref, res):
    print(f"REPRODUCED: {{ENTRY}} on tpu ({{MODE}}) differs from CPU")
    sys.exit(1)
print(f"not reproduced: {{ENTRY}} on tpu ({{MODE}}) agrees with CPU")
"""


def write_entry_repro(path: Path, entry_id: str, *, mode: str, tol: float, precision: str, dtype: str,
                      module_name: str = "", summary: str = "") -> Path:
    """The fallback: rebuild the zoo entry and compare its outputs (when the module cannot be saved alone)."""
    head = _HEADER.format(title=f"entry {entry_id} ({mode})", context=_context(entry_id, module_name or "<model>", "",
                                                                               summary),
                          filename=path.name, mode=mode, tol=tol, precision=precision, dtype=dtype)
    path.write_text(head + _ENTRY_BODY.format(entry_id=entry_id))
    return path
