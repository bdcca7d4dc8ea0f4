"""One process of test_executable_cache.py: a fixed set of eager ops on tpu (matmul, pointwise, reductions, a
view read inside its consumer's program, cat), compared with CPU. Prints, as the last line of JSON: op programs
traced (op_jit.traces), XLA compiles (not counting JAX's own cache hits), the executable cache's stats, the largest difference from CPU,
and a digest of the tpu outputs' bits. CHILD_PRECISION sets the matmul precision; CHILD_INJECT=1 replaces
gelu's lowering (x -> 2 * gelu(x)) for the whole process, as the sweep's canary does."""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import torch

import hf_tpu
from hf_tpu import executable_cache, op_jit, runtime


def ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    h = torch.nn.functional.gelu(x @ w + 1.5)
    return [h, h.softmax(-1).sum(0), torch.nn.functional.layer_norm(x, (16,)) * 2 - x.mean(),
            torch.add(x, x.t().t(), alpha=0.5), x.t() @ x, torch.cat([x, x * 3], 0).amax(1)]


def main() -> None:
    hf_tpu.set_matmul_precision(os.environ.get("CHILD_PRECISION", "highest"))
    jax = runtime.jax()
    compiles, loaded = [], []  # XLA compile events (JAX's own cache hits fire one too), JAX's cache hits
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, d, **_: compiles.append(event) if event.endswith("backend_compile_duration") else None)
    jax.monitoring.register_event_listener(
        lambda event, **_: loaded.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    inject = None
    if os.environ.get("CHILD_INJECT") == "1":
        from hf_tpu import hooks

        gelu = torch.ops.aten.gelu.default
        inject = hooks.override_lowerings(lambda op, fn: (lambda *a, **k: 2 * fn(*a, **k)) if op is gelu else None)
        inject.__enter__()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [t.cpu() for t in ops(x.to("tpu"), w.to("tpu"))]
    ref = ops(x, w)
    err = max(float((a - b).abs().max()) for a, b in zip(out, ref, strict=True))
    bits = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in out)).hexdigest()
    print(json.dumps({"traces": op_jit.traces, "compiles": len(compiles) - len(loaded), "stats": executable_cache.stats(),
                      "err": err, "bits": bits,
                      "warnings": [str(w.message) for w in caught if "executable cache" in str(w.message)]}))


if __name__ == "__main__":
    main()
