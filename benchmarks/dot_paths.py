"""Milliseconds per dot at GPT-2's training-step shapes through each path the host offers: XLA:CPU's default
(YNNPACK, float32 result then a separate rounding to the output type), YNNPACK with the rounding fused into
the dot (fusion type LIBRARY_FUSION_TYPE_DOT), XLA's oneDNN fusion, XLA's own (Eigen) dot, PyTorch's CPU
matmul on its own tensors, PyTorch's matmul on the JAX arrays through DLPack (no copy in), and PyTorch
called from inside an XLA program (jax.pure_callback).

  OMP_WAIT_POLICY=PASSIVE python benchmarks/dot_paths.py [--dtype bf16|f32] [--rounds 5] [--shapes 512x768x3072:nn,...]
                                                        [--paths xla-ynnpack,torch,...]

A shape MxKxN:nt is x (M, K) times w (N, K) transposed, as a linear layer computes it; MxKxN:nn is x (M, K)
times w (K, N) (a Conv1D layer's forward, and the backward dots: precision.py gives XLA these two forms).
Float32 accumulation (bfloat16: the products exact, float32 sums, the result rounded to bfloat16, as
precision.py's dots). Each path runs `--rounds` times, interleaved, each time enough calls for ~1 GFLOP;
printed per path: the median wall-ms and CPU-ms per call (min-max), the CPU-ms against XLA's default, the
largest difference from a float64 reference, and whether the result is bit-identical to XLA's default
("same"). OMP_WAIT_POLICY=PASSIVE keeps PyTorch's spinning OpenMP threads from counting as CPU-seconds on a
busy machine. Not a test; the note of issue 31 has the figures: no XLA path beat XLA's default with the same
results (on an AMX-BF16 Xeon, bfloat16: XLA's oneDNN fusion widens the operands to float32 first, 3-6x the
CPU time of YNNPACK's bfloat16 kernel; YNNPACK with the rounding fused is 2.5-5x and rounds differently;
float32: oneDNN 0.87-1.41x, slower on the LM head, not bit-identical on most shapes). PyTorch's own
(oneDNN, AMX) bfloat16 matmul takes 0.42-0.69x the CPU time of XLA's default there, through DLPack too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

# GPT-2 124M at 4 x 128 tokens: a layer's forward (Conv1D, nn), its input gradient (nt) and weight gradient
# (nn, the transposed activations made row-major), the LM head's forward (nt) and both gradients (nn); and
# one small program (64 tokens)
SHAPES = ("512x768x2304:nn,512x768x3072:nn,512x3072x768:nn,512x3072x768:nt,768x512x3072:nn,"
          "512x768x50257:nt,512x50257x768:nn,768x512x50257:nn,64x768x768:nn")


def paths(dtype: str, layout: str) -> dict[str, Any]:
    """The paths for x @ w in `layout` ("nt": w is (N, K); "nn": w is (K, N)), by name."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax import lax

    jdt = jnp.float32 if dtype == "f32" else jnp.bfloat16

    w_contract = 1 if layout == "nt" else 0

    def dot(x: Any, w: Any) -> Any:
        return lax.dot_general(x, w, (((1,), (w_contract,)), ((), ())),
                               preferred_element_type=jnp.float32).astype(jdt)

    def torch_dot(a: Any, b: Any) -> Any:
        return torch.mm(a, b.t() if layout == "nt" else b)

    def host(a: Any, b: Any) -> Any:
        return np.asarray(jax.dlpack.from_dlpack(torch_dot(torch.from_dlpack(a), torch.from_dlpack(b))))

    def callback(x: Any, w: Any) -> Any:
        return jax.pure_callback(host, jax.ShapeDtypeStruct((x.shape[0], w.shape[1 - w_contract]), jdt), x, w)

    def via_dlpack(x: Any, w: Any) -> Any:
        return jax.dlpack.from_dlpack(torch_dot(torch.from_dlpack(x), torch.from_dlpack(w)))

    return {
        "xla-ynnpack": jax.jit(dot),
        # the dot and its rounding in one YNNPACK fusion (no float32 result in memory)
        "xla-ynn-fused": jax.jit(dot, compiler_options={
            "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}),
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
    ap.add_argument("--paths", default="", help="comma-separated path names (default: all)")
    args = ap.parse_args()

    import jax.numpy as jnp
    import numpy as np
    import torch

    jdt = jnp.float32 if args.dtype == "f32" else jnp.bfloat16
    wanted = set(filter(None, args.paths.split(",")))
    for shape in args.shapes.split(","):
        dims, _, layout = shape.partition(":")
        layout = layout or "nt"
        m, k, n = map(int, dims.split("x"))
        every = paths(args.dtype, layout)
        # XLA's default always runs: it is the reference of "same" and of the ratios
        fns = {name: f for name, f in every.items() if not wanted or name in wanted or name == "xla-ynnpack"}
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(jdt)
        w = jnp.asarray(rng.standard_normal((n, k) if layout == "nt" else (k, n), dtype=np.float32)).astype(jdt)
        xt, wt = torch.from_dlpack(x).clone(), torch.from_dlpack(w).clone()
        wt_kn = wt.t() if layout == "nt" else wt
        calls = {name: (lambda f=f: f(x, w).block_until_ready()) for name, f in fns.items()}
        if not wanted or "torch" in wanted:
            calls["torch"] = lambda: torch.mm(xt, wt_kn)
        outs = {name: torch.from_dlpack(f(x, w)).double() for name, f in fns.items()}
        if "torch" in calls:
            outs["torch"] = calls["torch"]().double()
        ref = xt.double() @ wt_kn.double()
        err = {name: float((out - ref).abs().max()) for name, out in outs.items()}
        same = {name: bool(torch.equal(out, outs["xla-ynnpack"])) for name, out in outs.items()}
        reps = max(1, int(1e9 / (2 * m * k * n)))
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        wall: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                t, c = time.perf_counter(), time.process_time()
                for _ in range(reps):
                    call()
                wall[name].append((time.perf_counter() - t) / reps * 1e3)
                cpu[name].append((time.process_time() - c) / reps * 1e3)
        base = statistics.median(cpu["xla-ynnpack"])
        print(f"{args.dtype} {m}x{k}x{n}:{layout}", flush=True)
        for name in calls:
            w_ms, c_ms = wall[name], cpu[name]
            print(f"  {name:18s} wall {statistics.median(w_ms):8.2f} ({min(w_ms):.2f}-{max(w_ms):.2f})  "
                  f"cpu {statistics.median(c_ms):8.2f} ({min(c_ms):.2f}-{max(c_ms):.2f}, "
                  f"{statistics.median(c_ms) / base:.2f}x)  err {err[name]:.2g}  same {same[name]}", flush=True)


if __name__ == "__main__":
    main()
