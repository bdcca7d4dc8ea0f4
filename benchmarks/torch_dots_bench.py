"""Milliseconds per dot on tpu's XLA:CPU buffers by three paths: XLA's own dot (YNNPACK), PyTorch's CPU matmul
on DLPack views of the JAX buffers (an eager path measured here and removed: it waits at every dot), and
PyTorch's matmul as an XLA FFI custom call inside the program (torch_dot_ffi.py, what hf-tpu uses); and
PyTorch's matmul on its own CPU tensors for reference.

  OMP_WAIT_POLICY=PASSIVE python benchmarks/torch_dots_bench.py [--dtype f32|bf16] [--rounds 5]
                                                               [--shapes 64x768x768,...]

Shapes are MxKxN: x (M, K) @ w, the weight stored (K, N) (`--weight kn`, as GPT-2's Conv1D) or (N, K) and
multiplied transposed (`--weight nk`: nn.Linear, and a tied LM head x @ embedding^T, the form these dots take
in a model's graph; YNNPACK is faster in it at large N: 64x768x50257 34.6 against 45.4 ms, measured).
Paths alternate within each round, 5 calls each; printed per path: the
fastest call's wall-ms over all rounds (on a loaded machine, the call that had both cores) and the median
CPU-ms per call (process time, all threads), and the wall ratios to XLA's. The MACs threshold of
torch_dot_ffi.MIN_MACS comes from where the torch paths stop losing to XLA.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

SHAPES = ("16x64x64,16x64x256,64x128x128,64x128x512,64x256x256,64x256x1024,64x512x512,64x768x768,64x768x2304,"
          "64x768x3072,64x3072x768,64x768x50257")


def _time(fn: Any, calls: int = 5) -> tuple[float, float]:
    """(the fastest call's wall-ms, CPU-ms per call): on a shared machine the fastest call is the one that had
    both cores, the nearest to a quiet machine's time."""
    fn()
    best, c0 = float("inf"), time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, (time.process_time() - c0) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--weight", default="kn", choices=("kn", "nk"),
                    help="the weight as stored: (K, N), or (N, K) multiplied transposed (nn.Linear, tied LM heads)")
    args = ap.parse_args()

    import torch

    import hf_tpu  # noqa: F401 - the device
    from hf_tpu import runtime, torch_dot_ffi

    jax = runtime.jax()
    jnp = jax.numpy
    assert torch_dot_ffi.ensure(), torch_dot_ffi.status()
    tdt = torch.float32 if args.dtype == "f32" else torch.bfloat16
    nk = args.weight == "nk"  # b is (N, K): the dot contracts its last dim, and the handler reads it transposed
    contract = (((1,), (1 if nk else 0,)), ((), ()))
    xla = jax.jit(lambda a, b: jax.lax.dot_general(a, b, contract,
                                                   preferred_element_type=jnp.float32).astype(a.dtype))
    ffi = jax.jit(lambda a, b: torch_dot_ffi._dot(a, b, 0, int(nk), None, 1.0, 1.0))
    print(f"dtype {args.dtype}, weight {args.weight}, torch threads {torch.get_num_threads()}; fastest wall-ms / "
          f"median CPU-ms per call, {args.rounds} rounds")
    print(f"{'shape':>14} {'MACs':>10} | {'xla':>13} | {'torch-dlpack':>13} | {'ffi':>13} | {'torch-own':>13} |"
          " dlpack/xla ffi/xla")
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        a, b = torch.randn(m, k, dtype=tdt), torch.randn(*((n, k) if nk else (k, n)), dtype=tdt)
        ja, jb = jax.dlpack.from_dlpack(a.clone()), jax.dlpack.from_dlpack(b.clone())
        ja, jb = jnp.array(ja), jnp.array(jb)  # XLA's own buffers

        def dlpack() -> Any:
            ja.block_until_ready(), jb.block_until_ready()
            w = torch.from_dlpack(jb)
            out = torch.mm(torch.from_dlpack(ja), w.t() if nk else w)
            return jax.dlpack.from_dlpack(out)

        paths = {"xla": lambda: xla(ja, jb).block_until_ready(), "torch-dlpack": lambda: dlpack().block_until_ready(),
                 "ffi": lambda: ffi(ja, jb).block_until_ready(), "torch-own": lambda: torch.mm(a, b.t() if nk else b)}
        res: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
        for _ in range(args.rounds):
            for p, fn in paths.items():
                res[p].append(_time(fn))
        med = {p: (min(w for w, _ in r), statistics.median(c for _, c in r)) for p, r in res.items()}
        cells = " | ".join(f"{med[p][0]:6.3f}/{med[p][1]:6.3f}" for p in paths)
        print(f"{shape:>14} {m * k * n:>10} | {cells} | {med['torch-dlpack'][0] / med['xla'][0]:10.2f} "
              f"{med['ffi'][0] / med['xla'][0]:7.2f}", flush=True)


if __name__ == "__main__":
    main()
