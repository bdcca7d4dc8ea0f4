#!/usr/bin/env python
"""hf-tpu diagnose repro: aten::topk.default (eager)
Entry: transformers/pp_doclayout_v3/PPDocLayoutV3Model
Module: <model> (PPDocLayoutV3Model)
Found: aten::topk.default in <model> (PPDocLayoutV3Model) differs on tpu from CPU on the same inputs: max abs err 61
Run: python repro.py   (exit 1: reproduced; 0: tpu agrees with CPU; 2: the CPU run fails too)"""
import sys

import torch

import hf_tpu  # noqa: F401  (the tpu device; `import torch` alone also registers it)

MODE = 'eager'  # eager: the op runs through hf_tpu's dispatch; compiled: inside torch.compile(backend="tpu")
TOL = 0.0001  # the sweep's allclose tolerance for precision 'highest', dtype 'float32'
torch.manual_seed(0)
hf_tpu.set_matmul_precision('highest')


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
        return {k: on(device, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(on(device, v) for v in x)
    return x


def tensors(x, name="out"):
    if isinstance(x, torch.Tensor):
        return [(name, x)]
    if isinstance(x, dict) or hasattr(x, "keys"):
        return [p for k in x.keys() for p in tensors(x[k], f"{name}.{k}")]
    if isinstance(x, (list, tuple)):
        return [p for i, v in enumerate(x) for p in tensors(v, f"{name}.{i}")]
    return []


def check(ref, res):
    bad = 0
    for (name, a), (_, b) in zip(tensors(ref), tensors(res)):
        b = b.detach().cpu()
        if a.shape != b.shape:
            print(f"{name}: shape {tuple(b.shape)} on tpu != {tuple(a.shape)} on cpu")
            bad += 1
        elif a.is_floating_point():
            err = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0
            ok = torch.allclose(a, b.to(a.dtype), atol=TOL, rtol=TOL, equal_nan=True)
            print(f"{name}: {a.dtype}{list(a.shape)} max abs err {err:.3g} (tol {TOL:g})" + ("" if ok else "  <-- DIFFERS"))
            bad += not ok
        elif not torch.equal(a, b.to(a.dtype)):
            print(f"{name}: {a.dtype}{list(a.shape)} values differ")
            bad += 1
    return bad


op = torch.ops.aten.topk.default
args = [t((2, 84), torch.float32, lo=-0.6931471824645996, hi=-0.6931471824645996, mean=-0.6931471824645996, std=0.0), 16, 1]
kwargs = {}
try:
    ref = op(*args, **kwargs)
except Exception as exc:
    print(f"the CPU run fails too: {type(exc).__name__}: {exc}")
    sys.exit(2)
try:
    if MODE == "compiled":
        res = torch.compile(lambda *a, **k: op(*a, **k), backend="tpu", dynamic=False)(*on("tpu", args), **on("tpu", kwargs))
    else:
        res = op(*on("tpu", args), **on("tpu", kwargs))
    res = on("cpu", res)
except Exception as exc:
    print(f"REPRODUCED: {op} raises on tpu ({MODE}): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    sys.exit(1)
if check(ref, res):
    print(f"REPRODUCED: {op} on tpu ({MODE}) differs from CPU on the same inputs")
    sys.exit(1)
print(f"not reproduced: {op} on tpu ({MODE}) agrees with CPU")
