"""Batched LAPACK calls lowered so that they can never deadlock XLA:CPU's intra-op thread pool.

jaxlib's CPU LAPACK kernels (triangular solve, LU, Cholesky, QR, eigh, SVD, ...: jaxlib/cpu/lapack_kernels.cc,
jax 0.10.x) split a batch whose work is at least 200,000 flops (their `cost_per_matrix` estimate times the
batch) into chunks, schedule the chunks on the intra-op thread pool they are running on, and block until the
chunks finish. When every worker of that pool is such a kernel waiting for its chunks, no worker is left to
run them: the program never finishes. On a 2-core host the pool has 2 workers, and two batched solves that XLA
runs side by side are enough (a compiled training step's backward with several `linalg.solve`s hung in the
full-zoo sweep, every thread in futex_do_wait; tests/hf_tpu/test_lapack_batches.py hangs without this module
within a few hundred calls). XLA's `--xla_cpu_multi_thread_eigen=false` does not avoid it (measured: the
same hang).

So on CPU each such primitive with a batch of more than one matrix is lowered as a loop (`jax.lax.map` with
`batch_size`) over chunks small enough that jaxlib runs each chunk inline, on the calling worker. Each matrix
is still computed by the same LAPACK routine with the same arguments, so results are bit-identical; what is
lost is the kernels' own batch parallelism, which only large batches of matrices had (none in the zoo's
models). Written by hand because neither JAX nor XLA offers a switch for it (no flag sizes or bypasses the
pool the kernels use); installed once by runtime.jax().
"""

from __future__ import annotations

import math
from typing import Any

# jaxlib's kMinWorkPerTask: a kernel whose batch times cost_per_matrix is below it runs its batch inline.
JAXLIB_MIN_WORK_PER_TASK = 200_000
# Primitive name -> (the rank of its first operand's matrix part, the rest of its dimensions being the batch
# shared by every operand as in jax._src.lax.linalg's linalg_primitive; a factor F such that F * r * c *
# max(r, c) over the operands' trailing r x c matrices bounds jaxlib's cost_per_matrix: trsm r*c*r, getrf and
# potrf below r*c*min, geqrf/orgqr/ormqr 2*r*c*min, gesdd 10*r*c*min; 32 where jaxlib's estimate was not read),
# times 3 for complex as in jaxlib. A chunk under the floor by this bound is under it by jaxlib's own.
PRIMITIVES = {
    "triangular_solve": (2, 1), "lu": (2, 1), "cholesky": (2, 1), "geqrf": (2, 2), "geqp3": (2, 2),
    "householder_product": (2, 2), "ormqr": (2, 2), "svd": (2, 10), "eigh": (2, 32), "eig": (2, 32),
    "schur": (2, 32), "hessenberg": (2, 32), "tridiagonal": (2, 32), "tridiagonal_solve": (1, 32),
}

_installed = False


def chunk_size(avals: list[Any], factor: int) -> int:
    """Matrices per chunk: the most whose bounded cost stays below jaxlib's floor (at least 1)."""
    cost = 1
    for a in avals:
        if len(a.shape) >= 2:
            r, c = a.shape[-2], a.shape[-1]
            complex_ = 3 if "complex" in str(a.dtype) else 1
            cost = max(cost, factor * r * c * max(r, c) * complex_)
    return max(1, (JAXLIB_MIN_WORK_PER_TASK - 1) // cost)


def _chunked_rule(prim: Any, rank: int, factor: int, original: Any) -> Any:
    from jax._src.interpreters import mlir

    import jax

    def rule(ctx: Any, *args: Any, **params: Any) -> Any:
        avals = ctx.avals_in
        nb = len(avals[0].shape) - rank
        batch_shape = tuple(avals[0].shape[:nb])
        count = math.prod(batch_shape)
        size = chunk_size(avals, factor)
        if count <= size:  # jaxlib runs it inline already
            return original(ctx, *args, **params)

        def chunked(*xs: Any) -> Any:
            flat = tuple(x.reshape((count,) + x.shape[nb:]) for x in xs)
            # lax.map vmaps the primitive over each chunk: its lowering comes back here with `size` matrices
            outs = jax.lax.map(lambda ys: prim.bind(*ys, **params), flat, batch_size=size)
            unflat = [o.reshape(batch_shape + o.shape[1:]) for o in (outs if prim.multiple_results else [outs])]
            return unflat if prim.multiple_results else unflat[0]

        return mlir.lower_fun(chunked, multiple_results=prim.multiple_results)(ctx, *args)

    return rule


def install(jax_module: Any) -> None:
    """Replace the CPU lowering of every batched LAPACK primitive by its chunked form (once per process)."""
    global _installed
    if _installed:
        return
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg

    for name, (rank, factor) in PRIMITIVES.items():
        prim = getattr(linalg, f"{name}_p", None)
        if prim is None:  # a primitive this JAX does not have
            continue
        # JAX keeps no public accessor of a registered rule: its two registries, the CPU one first
        entry = mlir._platform_specific_lowerings["cpu"].get(prim) or mlir._lowerings.get(prim)
        if entry is None:
            continue
        mlir.register_lowering(prim, _chunked_rule(prim, rank, factor, entry.rule), platform="cpu", inline=entry.inline)
    _installed = True
