"""The fastest a compiled forward can be on this host: the model's dots and attention alone, against CPU eager.

  python benchmarks/compiled_floor.py [--models gpt2,qwen3-wide] [--repeats 20]

Issue 31 asks compiled inference for <= 0.9x CPU eager's time. A compiled program still computes every dot and
the attention; what it can remove is everything else (elementwise ops fused, no per-op Python or dispatch).
So its time is at least the time of those ops alone. This script records the leaf ATen ops of one CPU eager
forward (eager_bench.py's MODELS: seeded, offline, precision "highest", default threads and OpenMP
wait policy, as eager_bench.py times CPU eager) under a
TorchDispatchMode, keeps the matmul and attention ones (profile_classes.py's classes) with their arguments,
and times, alternating within each round:

  forward       the CPU eager forward itself (the denominator of every ratio of issue 31);
  torch-dots    the recorded matmul and attention ops replayed with PyTorch's CPU kernels, in order, nothing
                else (MKL/oneDNN: what a compiled graph calling PyTorch's GEMM, as torch_dot_ffi can, pays);
  xla-dots      the same dots as one jitted XLA program (precision HIGHEST; attention as softmax(q k^T) v):
                what XLA:CPU's own GEMMs pay in a compiled graph.

Printed: medians (min-max) over rounds and each floor's ratio to the forward. If the better floor is above
0.9, no compiled design using these GEMMs reaches the target on this host: the rest of the forward would
have to take negative time. Not a test; issue 31's note quotes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eager_bench import MODELS, build  # noqa: E402
from profile_classes import FORWARD_CLASSES  # noqa: E402

_KEEP = dict(FORWARD_CLASSES)["matmul"] + ("scaled_dot_product", "flash_attention", "efficient_attention")


def record_dots(model: Any, ids: Any) -> list[tuple[Any, tuple, dict]]:
    """The matmul and attention leaf ops of one forward, with detached copies of their arguments."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple[Any, tuple, dict]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if any(k in name for k in _KEEP):
                copy = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
                calls.append((func, tuple(map(copy, args)), {k: copy(v) for k, v in kwargs.items()}))
            return func(*args, **kwargs)

    with torch.no_grad(), Record():
        model(ids)
    return calls


def xla_program(calls: list[tuple[Any, tuple, dict]]) -> tuple[Any, list]:
    """One jitted program computing every recorded dot (and attention) at HIGHEST precision, and its inputs."""
    import jax
    import jax.numpy as jnp
    import torch

    hi = jax.lax.Precision.HIGHEST
    arrays: list = []

    def arg(t: torch.Tensor) -> int:
        arrays.append(jnp.asarray(t.contiguous().numpy()))
        return len(arrays) - 1

    plan = []
    for func, args, kwargs in calls:
        name = func.overloadpacket.__name__
        if name == "addmm":
            plan.append(("addmm", arg(args[0]), arg(args[1]), arg(args[2])))
        elif name in ("mm", "bmm", "matmul"):
            plan.append(("mm", arg(args[0]), arg(args[1])))
        elif name == "baddbmm":
            plan.append(("addmm", arg(args[0]), arg(args[1]), arg(args[2])))
        elif name == "linear":
            plan.append(("linear", arg(args[0]), arg(args[1]), arg(args[2]) if len(args) > 2 and args[2] is not None
                         else None))
        elif "scaled_dot_product" in name or "attention" in name:
            causal = bool(args[4]) if len(args) > 4 else bool(kwargs.get("is_causal", False))
            mask = kwargs.get("attn_mask", args[5] if len(args) > 5 and "flash" not in name else None)
            plan.append(("sdpa", arg(args[0]), arg(args[1]), arg(args[2]), causal,
                         None if mask is None else arg(mask), kwargs.get("scale")))
        else:
            raise SystemExit(f"compiled_floor: no XLA form for {func}; add one to xla_program")

    def run(xs: list) -> list:
        outs = []
        for kind, *ix in plan:
            if kind == "addmm":
                outs.append(xs[ix[0]] + jnp.matmul(xs[ix[1]], xs[ix[2]], precision=hi))
            elif kind == "mm":
                outs.append(jnp.matmul(xs[ix[0]], xs[ix[1]], precision=hi))
            elif kind == "linear":
                y = jnp.matmul(xs[ix[0]], xs[ix[1]].T, precision=hi)
                outs.append(y if ix[2] is None else y + xs[ix[2]])
            else:
                q, k, v = (xs[i] for i in ix[:3])
                causal, mask, scale = ix[3:]
                if k.shape[-3] != q.shape[-3]:  # grouped-query attention (enable_gqa): each kv head serves a group
                    k, v = (jnp.repeat(t, q.shape[-3] // t.shape[-3], axis=-3) for t in (k, v))
                s = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=hi) * (scale or q.shape[-1] ** -0.5)
                if causal:
                    s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
                if mask is not None:
                    m = xs[mask]
                    s = jnp.where(m, s, -jnp.inf) if m.dtype == jnp.bool_ else s + m
                outs.append(jnp.matmul(jax.nn.softmax(s, axis=-1), v, precision=hi))
        return outs

    return jax.jit(run), arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,qwen3-wide")
    parser.add_argument("--repeats", type=int, default=20)
    a = parser.parse_args()
    import jax
    import torch

    torch.set_float32_matmul_precision("highest")
    print(f"torch threads {torch.get_num_threads()}, jax {jax.__version__}, {a.repeats} rounds, ms (median, min-max)")
    print(f"{'model':>12} {'forward':>18} {'torch-dots':>18} {'xla-dots':>18} | torch/fwd  xla/fwd  best/fwd")
    for name in a.models.split(","):
        seq = MODELS[name][3]
        model = build(name)
        torch.manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1, seq))
        calls = record_dots(model, ids)
        prog, arrays = xla_program(calls)
        # the same work: each XLA result is the PyTorch op's (attention: SDPA's first output)
        import numpy as np

        for (func, args, kwargs), got in zip(calls, prog(arrays)):
            want = func(*args, **kwargs)
            want = want[0] if isinstance(want, tuple) else want
            if not np.allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-4):
                raise SystemExit(f"compiled_floor: the XLA form of {func} differs from PyTorch's; fix xla_program")

        def forward() -> None:
            with torch.no_grad():
                model(ids)

        def torch_dots() -> None:
            with torch.no_grad():
                for func, args, kwargs in calls:
                    func(*args, **kwargs)

        paths = {"forward": forward, "torch-dots": torch_dots,
                 "xla-dots": lambda: jax.block_until_ready(prog(arrays))}
        for fn in paths.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(a.repeats):
            for key, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        cell = lambda k: f"{med[k]:6.1f} ({min(times[k]):.1f}-{max(times[k]):.1f})"  # noqa: E731
        print(f"{name:>12} {cell('forward'):>18} {cell('torch-dots'):>18} {cell('xla-dots'):>18} | "
              f"{med['torch-dots'] / med['forward']:8.2f} {med['xla-dots'] / med['forward']:8.2f} "
              f"{min(med['torch-dots'], med['xla-dots']) / med['forward']:9.2f}   ({len(calls)} ops kept)")


if __name__ == "__main__":
    main()
