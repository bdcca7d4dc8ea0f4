"""Linear-algebra ops torchax does not lower (or lowers with missing outputs): `_linalg_det` (torch.linalg.det,
and its backward's LU), `_linalg_slogdet`, `geqrf`, `ormqr` and `linalg_ldl_solve`; `linalg_inv_ex` and
`linalg_lu_factor_ex` with getrf's real `info` (torchax's was always 0).

`_linalg_svd` and `_linalg_eigh` are torchax's with the schema's compute_uv/compute_v flags (and eigh reading only
its triangle, as LAPACK's syevd); `linalg_pinv` is CPU's algorithm over them.

`_linalg_det`, `geqrf` and `ormqr` are JAX's own factorisations (the LAPACK ones CPU calls: getrf, geqrf,
ormqr/unmqr). `linalg_ldl_solve` has no JAX counterpart (JAX has no LDL^T, jax-ml/jax#12779), so it is
LAPACK's sytrs/hetrs written out: it reads the Bunch-Kaufman factors and pivots CPU's `ldl_factor` makes.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


@lowers(aten._linalg_det.default)
def _linalg_det(a: Any) -> tuple[Any, Any, Any]:
    """(det, LU, pivots) as CPU: det is the product of U's diagonal times the permutation's sign; LU and the
    1-based int32 pivots (getrf's) are what linalg_det_backward solves with. For a real matrix CPU factors
    A^T (the F-contiguous view of a C-contiguous A, det(A^T) = det(A)), and the backward then solves with
    adjoint=False: the same LU here, or the gradient comes out transposed. (CPU factors A itself when A is
    not contiguous; a lowering sees values, not strides: tpu's inputs here are taken as contiguous.)"""
    jax = _jax()
    jnp = jax.numpy
    n = a.shape[-1]
    if n == 0:
        return (jnp.ones(a.shape[:-2], a.dtype), a, jnp.zeros(a.shape[:-1], jnp.int32))
    real = not jnp.issubdtype(a.dtype, jnp.complexfloating)
    lu, pivots, _ = jax.lax.linalg.lu(jnp.swapaxes(a, -1, -2) if real else a)
    swaps = (pivots != jnp.arange(n, dtype=pivots.dtype)).sum(-1)
    sign = jnp.where(swaps % 2 == 0, 1, -1).astype(a.dtype)
    det = sign * jnp.prod(jnp.diagonal(lu, axis1=-2, axis2=-1), axis=-1)
    return det, lu, (pivots + 1).astype(jnp.int32)


@lowers(aten._linalg_slogdet.default)
def _linalg_slogdet(a: Any) -> tuple[Any, Any, Any, Any]:
    """(sign, logabsdet, LU, pivots): torchax's returns only the first two, which PyTorch read as missing
    tensors ("Expected Tensor but got None" for logdet and slogdet). From the same LU as det: sign is the
    permutation's sign times the product of U's diagonal over its moduli (0 when singular), logabsdet the sum
    of the diagonal's log moduli (-inf when singular), real for complex input as CPU."""
    jnp = _jax().numpy
    det, lu, pivots = _linalg_det(a)
    n = a.shape[-1]
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    mod = jnp.abs(diag)
    singular = (mod == 0).any(-1)
    swaps = (pivots != jnp.arange(1, n + 1, dtype=pivots.dtype)).sum(-1)
    unit = jnp.prod(diag / jnp.where(mod == 0, 1, mod).astype(diag.dtype), axis=-1)
    sign = jnp.where(singular, 0, jnp.where(swaps % 2 == 0, 1, -1).astype(a.dtype) * unit).astype(a.dtype)
    logabs = jnp.log(mod).sum(-1)
    return sign, logabs, lu, pivots


@lowers(aten.geqrf.default)
def _geqrf(a: Any) -> tuple[Any, Any]:
    """(a, tau) in LAPACK's compact form: R on and above the diagonal, the Householder vectors below.
    jnp.linalg.qr's "raw" mode returns exactly geqrf's output, with `a` transposed."""
    jnp = _jax().numpy
    h, tau = jnp.linalg.qr(a, mode="raw")
    return jnp.swapaxes(h, -1, -2), tau


@lowers(aten.ormqr.default)
def _ormqr(a: Any, tau: Any, other: Any, left: bool = True, transpose: bool = False) -> Any:
    """Q @ other (or Q^H, or on the right) with Q from geqrf's reflectors, not materialised (LAPACK's ormqr)."""
    return _jax().lax.linalg.ormqr(a, tau, other, left=left, transpose=transpose)


@lowers(aten.linalg_ldl_solve.default)
def _ldl_solve(ld: Any, pivots: Any, b: Any, hermitian: bool = False) -> Any:
    """X with A X = B, A = L D L^T (L D L^H if hermitian) in sytrf's lower form: unit-lower L below the
    diagonal, D's 1x1 and 2x2 blocks on it, pivots > 0 a 1x1 block (rows k and pivots[k] swapped), a
    negative pair a 2x2 block (rows k+1 and -pivots[k] swapped). The blocks are data, so each solve is a
    while loop over them, LAPACK's sytrs/hetrs step by step (batches vmapped)."""
    jax = _jax()
    jnp = jax.numpy
    n = ld.shape[-1]
    dtype = jnp.result_type(ld.dtype, b.dtype)
    batch = jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2])
    if n == 0 or b.shape[-1] == 0 or 0 in batch:
        return jnp.zeros((*batch, n, b.shape[-1]), dtype)
    ld = jnp.broadcast_to(ld, (*batch, n, n)).astype(dtype).reshape(-1, n, n)
    piv = jnp.broadcast_to(pivots, (*batch, n)).astype(jnp.int32).reshape(-1, n)
    rhs = jnp.broadcast_to(b, (*batch, n, b.shape[-1])).astype(dtype).reshape(-1, n, b.shape[-1])
    conj = (lambda v: jnp.conj(v)) if hermitian else (lambda v: v)  # noqa: E731
    rows = jnp.arange(n)

    def swap(x: Any, i: Any, j: Any) -> Any:
        xi, xj = x[i], x[j]
        return x.at[i].set(xj).at[j].set(xi)

    def solve(a: Any, p: Any, x: Any) -> Any:
        # forward: L D Y = P B, one block at a time
        def fwd(state: tuple[Any, Any]) -> tuple[Any, Any]:
            k, x = state
            one = p[k] > 0

            def block1(x: Any) -> Any:
                x = swap(x, k, p[k] - 1)
                col = jnp.where(rows > k, a[:, k], 0)
                x = x - col[:, None] * x[k][None, :]
                return x.at[k].set(x[k] / a[k, k])

            def block2(x: Any) -> Any:
                k1 = jnp.minimum(k + 1, n - 1)
                x = swap(x, k1, -p[k] - 1)
                below = rows > k1
                x = x - jnp.where(below, a[:, k], 0)[:, None] * x[k][None, :]
                x = x - jnp.where(below, a[:, k1], 0)[:, None] * x[k1][None, :]
                akm1k = a[k1, k]
                akm1 = a[k, k] / conj(akm1k)
                ak = a[k1, k1] / akm1k
                denom = akm1 * ak - 1
                bkm1 = x[k] / conj(akm1k)
                bk = x[k1] / akm1k
                return x.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)

            x = jax.lax.cond(one, block1, block2, x)
            return k + jnp.where(one, 1, 2), x

        _, x = jax.lax.while_loop(lambda s: s[0] < n, fwd, (jnp.int32(0), x))

        # backward: L^T X = Y (L^H if hermitian), last block first
        def bwd(state: tuple[Any, Any]) -> tuple[Any, Any]:
            k, x = state
            one = p[k] > 0

            def block1(x: Any) -> Any:
                col = jnp.where(rows > k, conj(a[:, k]), 0)
                x = x.at[k].add(-(col[:, None] * x).sum(0))
                return swap(x, k, p[k] - 1)

            def block2(x: Any) -> Any:
                km1 = jnp.maximum(k - 1, 0)
                below = rows > k
                x = x.at[k].add(-(jnp.where(below, conj(a[:, k]), 0)[:, None] * x).sum(0))
                x = x.at[km1].add(-(jnp.where(below, conj(a[:, km1]), 0)[:, None] * x).sum(0))
                return swap(x, k, -p[k] - 1)

            x = jax.lax.cond(one, block1, block2, x)
            return k - jnp.where(one, 1, 2), x

        _, x = jax.lax.while_loop(lambda s: s[0] >= 0, bwd, (jnp.int32(n - 1), x))
        return x

    out = jax.vmap(solve)(ld, piv, rhs)
    return out.reshape(*batch, n, b.shape[-1])


def getrf_info(lu: Any) -> Any:
    """LAPACK getrf's `info` per matrix, from its packed LU: the 1-based index of U's first diagonal element that
    is exactly zero (singular: CPU's linalg.inv, solve and lu_factor then raise), 0 when there is none.
    torchax's `_ex` lowerings reported 0 always, so a singular matrix gave inf/nan with no error."""
    jnp = _jax().numpy
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    if zero.shape[-1] == 0:  # an empty matrix (OpInfo's 0 x 0 samples): nothing singular, and no argmax
        return jnp.zeros(zero.shape[:-1], jnp.int32)
    return jnp.where(zero.any(-1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)


@lowers(aten.linalg_inv_ex.default)
def _linalg_inv_ex(a: Any, *, check_errors: bool = False) -> tuple[Any, Any]:
    """(inverse, info) as CPU's getrf + getri; jnp.linalg.inv factors A again inside (it does not take an LU),
    a second factorization rather than a hand-written inverse from this one."""
    jax = _jax()
    lu, _, _ = jax.lax.linalg.lu(a)
    return jax.numpy.linalg.inv(a), getrf_info(lu)


@lowers(aten.linalg_lu_factor_ex.default)
def _linalg_lu_factor_ex(a: Any, *, pivot: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any]:
    """(LU, 1-based int32 pivots, info) as CPU's getrf. (pivot=False is CUDA's only; CPU refuses it.)"""
    jax = _jax()
    lu, piv, _ = jax.lax.linalg.lu(a)
    return lu, (piv + 1).astype(jax.numpy.int32), getrf_info(lu)


@lowers(aten._linalg_check_errors.default, kind="eager")
def _linalg_check_errors(info: torch.Tensor, api_name: str, *, is_matrix: bool) -> None:
    """CPU's check of an `_ex` op's info, raising CPU's LinAlgError messages (linalg.inv, solve, cholesky,
    lu_factor, ... call it after their `_ex` form). The info is read on the host, as CPU's kernel reads it
    (`.item()`); torchax's lowering was a no-op, so no tpu linalg op ever raised. (Compiled graphs check their
    infos after the program: graph_compiler._check_errors.)"""
    torch.ops.aten._linalg_check_errors(info.cpu(), api_name, is_matrix=is_matrix)


@lowers(aten.linalg_lu_solve.default)
def _linalg_lu_solve(lu: Any, pivots: Any, b: Any, *, left: bool = True, adjoint: bool = False) -> Any:
    """X with A X = B (A^H X = B with adjoint), or X A = B (X A^H = B) when not `left`, from getrf's LU and
    1-based pivots. From the right, X A = B is A^T X^T = B^T, and X A^H = B is A X^H = B^H: torchax solved
    A^H X^T = B^T and A X^T = B^T, the same for real A but wrong for complex (lu_solve complex64, left=False)."""
    jax = _jax()
    jnp = jax.numpy
    factors = (lu, (pivots - 1).astype(jnp.int32))
    if left:
        return jax.scipy.linalg.lu_solve(factors, b, trans=2 if adjoint else 0)
    if adjoint:
        return jnp.conj(jnp.swapaxes(jax.scipy.linalg.lu_solve(factors, jnp.conj(jnp.swapaxes(b, -1, -2)), trans=0),
                                     -1, -2))
    return jnp.swapaxes(jax.scipy.linalg.lu_solve(factors, jnp.swapaxes(b, -1, -2), trans=1), -1, -2)


@lowers(aten._linalg_svd.default)
def _linalg_svd(a: Any, full_matrices: bool = False, compute_uv: bool = True, *,
                driver: str | None = None) -> tuple[Any, Any, Any]:
    """(U, S, Vh); without compute_uv (svdvals, matrix_rank, the nuclear norm) U and Vh are empty, as CPU's.
    torchax's took no compute_uv (TypeError for every caller but torch.linalg.svd). `driver` is CUDA's only."""
    jnp = _jax().numpy
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowers(aten._linalg_eigh.default)
def _linalg_eigh(a: Any, UPLO: str = "L", compute_v: bool = True) -> tuple[Any, Any]:  # noqa: N803 - ATen's name
    """(eigenvalues, eigenvectors) of a Hermitian matrix read from its `UPLO` triangle only, as LAPACK's syevd
    (jnp.linalg.eigh symmetrizes by default, (A + A^H) / 2, which differs when A is not Hermitian: the OpInfo
    samples); without compute_v (eigvalsh, matrix_rank(hermitian=True)) the eigenvectors are empty, as CPU's.
    torchax's took no compute_v."""
    jnp = _jax().numpy
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return (w, v) if compute_v else (w, jnp.zeros((0,), a.dtype))


@lowers(aten.linalg_pinv.atol_rtol_tensor)
def _linalg_pinv(a: Any, *, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Any:
    """CPU's pinv (BatchLinearAlgebra's linalg_pinv): a Hermitian input through eigh of its lower triangle,
    |eigenvalues| as singular values (torchax's ignored `hermitian` and `atol`, and took the SVD of the whole
    matrix: a non-Hermitian sample gave another matrix); tolerance max(atol, rtol * largest), rtol defaulting
    to eps * max(m, n), or to 0 when only a positive atol is given."""
    jnp = _jax().numpy
    real = jnp.finfo(a.dtype).dtype
    default_rtol = jnp.asarray(jnp.finfo(real).eps * max(a.shape[-2:]), real)
    if rtol is None:
        rtol = default_rtol if atol is None else jnp.where(jnp.asarray(atol) > 0, 0, default_rtol).astype(real)
    atol = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    rtol = jnp.asarray(rtol, real)
    if hermitian:
        s, u = _linalg_eigh(a, "L")
        s_abs = jnp.abs(s)
        tol = jnp.maximum(atol[..., None], rtol[..., None] * jnp.max(s_abs, -1, keepdims=True, initial=0))
        s_inv = jnp.where(s_abs > tol, 1 / s, 0).astype(a.dtype)
        return jnp.matmul(u * s_inv[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))
    u, s, vh = _linalg_svd(a, False)
    tol = jnp.maximum(atol[..., None], rtol[..., None] * s[..., :1])
    s_inv = jnp.where(s > tol, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(jnp.conj(jnp.swapaxes(vh, -1, -2)) * s_inv[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2)))


@lowers(aten.linalg_lstsq.default)
def _linalg_lstsq(a: Any, b: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any, Any]:
    """torchax's, with the residuals and singular values in the input's real dtype, as CPU's (torchax made its
    empty ones in the input dtype: complex64 where CPU gives float32)."""
    from hf_tpu.torchax_compat import load_op_table

    jnp = _jax().numpy
    table = load_op_table()[0]
    base = (table.get(aten.linalg_lstsq.default) or table[aten.linalg_lstsq]).func
    x, residuals, rank, sv = base(a, b, *args, **kwargs)
    real = jnp.finfo(a.dtype).dtype
    return x, jnp.asarray(residuals).astype(real), rank, jnp.asarray(sv).astype(real)
