"""CPU-seconds per dot at GPT-2's shapes through each path the host offers: XLA:CPU's default (YNNPACK),
XLA's oneDNN fusion, XLA's own (Eigen) dot, PyTorch's CPU matmul on its own tensors, PyTorch's matmul on the
JAX arrays through DLPack (no copy in), and PyTorch called from inside an XLA program (jax.pure_callback).

  OMP_WAIT_POLICY=PASSIVE python benchmarks/dot_paths.py [--dtype bf16|f32] [--rounds 5] [--shapes 512x768x3072,...]

A shape MxKxN is x (M, K) times w (N, K) transposed, as a linear layer computes it, with float32 accumulation
(bfloat16: the products exact, float32 sums, the result rounded to bfloat16, as precision.py's dots). Each
path runs `--rounds` times, interleaved, each time enough calls for ~1 GFLOP; printed: the median CPU-ms per
call (min-max) and the largest difference from a float64 reference. OMP_WAIT_POLICY=PASSIVE keeps
PyTorch's spinning OpenMP threads from counting as CPU-seconds on a busy machine. Not a test; the note of
issue 31 has the figures: no path beat XLA's default by enough to adopt (the module answers "is there a
faster path for large dots" with measurements).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

SHAPES = "64x768x768,64x768x3072,64x3072x768,512x768x768,512x768x3072,512x3072x768,512x768x50257"


def paths(dtype: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax import lax

    jdt = jnp.float32 if dtype == "f32" else jnp.bfloat16

    def dot(x: Any, w: Any) -> Any:
        return lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32).astype(jdt)

    def host(a: Any, b: Any) -> Any:
        return np.asarray(jax.dlpack.from_dlpack(torch.nn.functional.linear(torch.from_dlpack(a),
                                                                            torch.from_dlpack(b))))

    def callback(x: Any, w: Any) -> Any:
        return jax.pure_callback(host, jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jdt), x, w)

    def via_dlpack(x: Any, w: Any) -> Any:
        return jax.dlpack.from_dlpack(torch.nn.functional.linear(torch.from_dlpack(x), torch.from_dlpack(w)))

    return {
        "xla-ynnpack": jax.jit(dot),
        "xla-onednn": jax.jit(dot, compiler_options={
            "xla_cpu_use_onednn": True, "xla_cpu_experimental_ynn_fusion_type": "",
            "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}),
        "xla-eigen": jax.jit(dot, compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}),
        "torch-dlpack": via_dlpack,
        "xla-callback-torch": jax.jit(callback),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f32"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()

    import jax.numpy as jnp
    import numpy as np
    import torch

    jdt = jnp.float32 if args.dtype == "f32" else jnp.bfloat16
    fns = paths(args.dtype)
    for shape in args.shapes.split(","):
        m, k, n = map(int, shape.split("x"))
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(jdt)
        w = jnp.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(jdt)
        xt, wt = torch.from_dlpack(x).clone(), torch.from_dlpack(w).clone()
        calls = {name: (lambda f=f: f(x, w).block_until_ready()) for name, f in fns.items()}
        calls["torch"] = lambda: torch.nn.functional.linear(xt, wt)
        ref = xt.double() @ wt.double().T
        err = {name: float((torch.from_dlpack(f(x, w)).double() - ref).abs().max()) for name, f in fns.items()}
        err["torch"] = float((calls["torch"]().double() - ref).abs().max())
        reps = max(1, int(1e9 / (2 * m * k * n)))
        ms: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                t = time.process_time()
                for _ in range(reps):
                    call()
                ms[name].append((time.process_time() - t) / reps * 1e3)
        base = statistics.median(ms["xla-ynnpack"])
        print(f"{args.dtype} {shape}: " + "  ".join(
            f"{name} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, {statistics.median(v) / base:.2f}x, "
            f"err {err[name]:.2g})" for name, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
