"""hf_tpu.lapack_batches: batched LAPACK calls that cannot deadlock XLA:CPU's intra-op pool."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import re

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

# Four batched triangular solves XLA may run side by side, each with enough work for jaxlib to fan its batch
# out onto the pool it runs on: on a 2-worker pool this hung within a few hundred calls (3 of 3 runs of 300).
_PROGRAM = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from hf_tpu import runtime
    jax = runtime.jax()
    import jax.numpy as jnp
    n, b = 32, 256
    def f(a1, a2, b1, b2, b3, b4):
        return [jax.lax.linalg.triangular_solve(a, x, left_side=True, lower=True)
                for a, x in ((a1, b1), (a2, b2), (a1, b3), (a2, b4))]
    k = jax.random.split(jax.random.key(0), 6)
    tri = lambda kk: jnp.tril(jax.random.normal(kk, (b, n, n), jnp.float32)) + 4 * jnp.eye(n, dtype=jnp.float32)
    args = [tri(k[0]), tri(k[1])] + [jax.random.normal(kk, (b, n, n), jnp.float32) for kk in k[2:]]
    c = jax.jit(f)
    for _ in range(300):
        jax.block_until_ready(c(*args))
    print("done")
""")


@pytest.mark.slow  # a race: a few hundred calls to hang reliably without the chunking (tens of seconds)
def test_concurrent_batched_solves_finish():
    # a child process with a deadline: the failure this guards against is a hang
    env = {"HF_TPU_DISABLE_DISK_CACHE": "1", "PATH": "/usr/bin:/bin", "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "-c", _PROGRAM.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]


def test_chunked_lowering_is_bit_identical_to_one_matrix_at_a_time():
    from hf_tpu import lapack_batches, runtime

    jax = runtime.jax()
    import jax.numpy as jnp

    a = jnp.tril(jax.random.normal(jax.random.key(1), (100, 24, 24), jnp.float32)) + 3 * jnp.eye(24, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(2), (100, 24, 8), jnp.float32)
    size = lapack_batches.chunk_size([a.aval, x.aval], lapack_batches.PRIMITIVES["triangular_solve"][1])
    assert 1 < size < 100  # the batch is lowered in several chunks, one of them a remainder
    text = jax.jit(jax.lax.linalg.triangular_solve, static_argnames=("left_side", "lower")).lower(
        a, x, left_side=True, lower=True).as_text()
    assert "stablehlo.while" in text  # the loop over chunks
    got = jax.jit(lambda a, x: jax.lax.linalg.triangular_solve(a, x, left_side=True, lower=True))(a, x)
    one = [jax.lax.linalg.triangular_solve(a[i], x[i], left_side=True, lower=True) for i in range(100)]
    np.testing.assert_array_equal(np.asarray(got), np.stack([np.asarray(o) for o in one]))
    # and LU, whose primitive has several results
    lu, piv, perm = jax.jit(jax.lax.linalg.lu)(a)
    lu1 = jax.lax.linalg.lu(a[7])
    np.testing.assert_array_equal(np.asarray(lu[7]), np.asarray(lu1[0]))
    np.testing.assert_array_equal(np.asarray(piv[7]), np.asarray(lu1[1]))


def test_a_small_batch_keeps_jaxlibs_own_lowering():
    from hf_tpu import runtime

    jax = runtime.jax()
    import jax.numpy as jnp

    a = jnp.eye(4, dtype=jnp.float32)[None].repeat(3, 0)
    text = jax.jit(jax.lax.linalg.cholesky).lower(a).as_text()
    assert "stablehlo.while" not in text and "potrf" in text


@pytest.mark.parametrize("name", ["triangular_solve", "lu", "cholesky", "qr", "eigh", "svd"])
def test_no_lapack_call_gets_a_batch_jaxlib_would_fan_out(name):
    """The deterministic side of the race above: after lowering, every LAPACK custom call's batch is one that
    jaxlib runs inline (batch x cost below its floor), so no kernel ever waits on the pool it runs on. Before
    hf_tpu.lapack_batches, each call took the whole batch of 256."""
    from hf_tpu import lapack_batches, runtime

    jax = runtime.jax()
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(3), (256, 32, 32), jnp.float32)
    spd = a @ jnp.swapaxes(a, -1, -2) + 32 * jnp.eye(32, dtype=jnp.float32)
    fn = {"triangular_solve": lambda m: jax.lax.linalg.triangular_solve(jnp.tril(m) + 8 * jnp.eye(32, dtype=jnp.float32), m,
                                                                          left_side=True, lower=True),
          "lu": jax.lax.linalg.lu, "cholesky": jax.lax.linalg.cholesky, "qr": jnp.linalg.qr,
          "eigh": jnp.linalg.eigh, "svd": jnp.linalg.svd}[name]
    text = jax.jit(fn).lower(spd).as_text()
    calls = [line for line in text.splitlines() if "custom_call @lapack_" in line]
    assert calls, text[:2000]
    floor = lapack_batches.JAXLIB_MIN_WORK_PER_TASK
    for line in calls:
        dims = [int(d) for d in re.search(r": \(tensor<([0-9x]+)x[a-z]", line).group(1).split("x")]
        batch, (r, c) = int(np.prod(dims[:-2])), dims[-2:]
        assert batch * r * c * min(r, c) < floor, line  # below even the smallest of jaxlib's cost estimates x F
