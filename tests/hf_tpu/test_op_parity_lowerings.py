"""Lowerings added for the OpInfo parity run's failure groups (issue 26), each checked against CPU on inputs
that cover every branch of CPU's kernel (the OpInfo samples touch only a few values)."""

from __future__ import annotations

import pytest
import torch

import op_parity

F = torch.nn.functional


def _close(expected: torch.Tensor, actual: torch.Tensor) -> None:
    op_parity.compare(expected, actual)


# airy_ai: x < -2.09 (oscillating asymptotic form), the series between, x >= 2.09 (decaying form), past 103.892
# (0) and +-inf (NaN); the scaled Bessel K: 0 (inf), negatives (NaN), (0, 2] and above 2.
_GRID = torch.cat([torch.linspace(-30, 30, 1201), torch.tensor([-2.09, 2.09, 8.3203353, 103.0, 104.0, 1e3, 0.0,
                                                                 -0.0, 0.49, 0.5, float("inf"), -float("inf")])])


@pytest.mark.parametrize("fn", [torch.special.airy_ai, torch.special.scaled_modified_bessel_k0,
                                torch.special.scaled_modified_bessel_k1, torch.special.spherical_bessel_j0],
                         ids=lambda f: f.__name__)
def test_special_functions_match_cpu_on_every_branch(fn) -> None:
    _close(fn(_GRID), fn(_GRID.to("tpu")))
    ints = torch.arange(-5, 40)  # integers are promoted to the default float dtype, as on CPU
    _close(fn(ints), fn(ints.to("tpu")))


def test_zeta_domain_as_cpu() -> None:
    """CPU's Cephes zeta: x == 1 is inf, x < 1 NaN whatever q (tpu gave inf at x = 0, q = 0: every OpInfo
    bool sample), a non-positive integer q inf (tpu: NaN for non-integer x); the rest is unchanged."""
    x = torch.tensor([2.0, 2.0, 2.0, 3.5, 2.5, 0.5, 1.5, -1.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    q = torch.tensor([-1.5, -2.0, 0.5, -1.5, -2.0, 1.0, 1.0, 2.0, -0.0, 1.0, 0.0, 1.0, 0.0, -2.0])
    _close(torch.special.zeta(x, q), torch.special.zeta(x.to("tpu"), q.to("tpu")))
    b = torch.tensor([True, False, True, False])
    _close(torch.special.zeta(b, b.flip(0)), torch.special.zeta(b.to("tpu"), b.flip(0).to("tpu")))


@pytest.mark.parametrize("name", ["softshrink", "hardshrink"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_backward(name, dtype) -> None:
    """The gradient is zero on [-lambd, lambd] (the ends included) and the output gradient elsewhere."""
    x = torch.tensor([-2.0, -0.5, -0.3, 0.0, 0.3, 0.5, 0.7, 2.0], dtype=dtype)
    w = torch.arange(1, 9, dtype=dtype)
    grads = []
    for dev in ("cpu", "tpu"):
        v = x.detach().to(dev).requires_grad_()
        (getattr(F, name)(v, 0.5) * w.to(dev)).sum().backward()
        grads.append(v.grad)
    _close(*grads)


def test_margin_losses_forward_and_backward() -> None:
    """multi_margin_loss's backward (no decomposition existed), multilabel_margin_loss's forward and backward
    (PyTorch's forward decomposition miscounts rows whose target list ends early, as rows 0, 1, 3 and 5 here)."""
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    target = torch.tensor([0, 4, 2, 1, 3, 0])
    labels = torch.tensor([[0, 3, -1, 2, 1], [4, -1, 0, 0, 0], [1, 2, 3, 4, -1], [2, -1, 1, 1, 1],
                           [0, 1, 2, 3, 4], [3, 0, -1, 1, 2]])
    weight = torch.rand(5)
    cases = [lambda v, d: F.multi_margin_loss(v, target.to(d)),
             lambda v, d: F.multi_margin_loss(v, target.to(d), p=2, margin=0.7, weight=weight.to(d),
                                              reduction="sum"),
             lambda v, d: F.multilabel_margin_loss(v, labels.to(d)),
             lambda v, d: F.multilabel_margin_loss(v, labels.to(d), reduction="none"),
             lambda v, d: F.multilabel_margin_loss(v[1], labels[1].to(d), reduction="sum")]
    for case in cases:
        grads = []
        for dev in ("cpu", "tpu"):
            v = x.detach().to(dev).requires_grad_()
            out = case(v, dev)
            (out * torch.arange(1, out.numel() + 1, device=dev).reshape(out.shape)).sum().backward()
            grads.append((out, v.grad))
        _close(*grads)


@pytest.mark.parametrize("make, dtype, instead", [
    (lambda x: x.chalf(), "complex32", "complex64"),
    (lambda x: torch.complex(x.half(), x.half()), "complex32", "complex64"),
    (lambda x: torch.hash_tensor(x), "uint64", "int64"),
    (lambda x: torch.zeros(2, dtype=torch.uint64, device=x.device), "uint64", "int64"),
])
def test_declared_unsupported_dtypes_name_the_dtype_and_the_alternative(make, dtype, instead) -> None:
    """complex32 and uint64 (docs/device.md): a clear error, counted apart by the parity run."""
    with pytest.raises(TypeError) as info:
        make(torch.ones(3, device="tpu"))
    msg = str(info.value)
    assert f"dtype torch.{dtype} is not supported on tpu" in msg and instead in msg, msg
    assert op_parity._cause(info.value) == f"unsupported: dtype torch.{dtype}"


def _pair(fn, *args):
    """fn on CPU and on tpu (every tensor argument moved)."""
    moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    return fn(*args), fn(*moved)


def test_det_and_slogdet_with_pivoting_singular_and_batches() -> None:
    torch.manual_seed(0)
    a = torch.randn(4, 4, 4)
    a[1, 0, 0] = 0  # forces a row exchange
    a[2, 3] = 0  # singular: det 0, slogdet (0, -inf) whatever the rounding (not so equal rows: ~1e-8 either way)
    for fn in (torch.linalg.det, torch.linalg.slogdet, torch.logdet, lambda m: torch.linalg.det(m.to(torch.complex64)),
               lambda m: torch.linalg.slogdet(m.to(torch.complex64))):
        _close(*_pair(fn, a))

    # the backward solves with the forward's LU (CPU's is of A^T for a real A: a wrong one transposes it)
    for fn in (torch.linalg.det, lambda m: torch.linalg.slogdet(m)[1], torch.logdet):
        g = []
        for dev in ("cpu", "tpu"):
            v = a[:2].detach().to(dev).requires_grad_()
            (fn(v) * torch.tensor([1.0, 2.0], device=dev)).sum().backward()
            g.append(v.grad)
        _close(*g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_geqrf_and_ormqr(dtype) -> None:
    torch.manual_seed(0)
    a = torch.randn(2, 5, 3, dtype=dtype)
    _close(*_pair(torch.geqrf, a))
    h, tau = torch.geqrf(a)
    for left, transpose in ((True, False), (True, True), (False, False), (False, True)):
        c = torch.randn(2, 5, 4, dtype=dtype) if left else torch.randn(2, 4, 5, dtype=dtype)
        _close(*_pair(lambda h_, t_, c_: torch.ormqr(h_, t_, c_, left=left, transpose=transpose), h, tau, c))


@pytest.mark.parametrize("dtype, hermitian", [(torch.float32, False), (torch.complex64, False),
                                              (torch.complex64, True)])
def test_ldl_solve_reads_cpus_bunch_kaufman_pivots(dtype, hermitian) -> None:
    """Symmetric indefinite matrices with small diagonals make CPU's sytrf pick 2x2 blocks and row swaps."""
    torch.manual_seed(0)
    m = torch.randn(3, 6, 6, dtype=dtype)
    a = m + (m.mH if hermitian else m.mT)
    a.diagonal(dim1=-2, dim2=-1).mul_(0.01)
    if hermitian:
        a.diagonal(dim1=-2, dim2=-1).imag.zero_()
    ld, pivots = torch.linalg.ldl_factor(a, hermitian=hermitian)
    assert (pivots < 0).any() and (pivots != torch.arange(1, 7, dtype=torch.int32)).any()  # blocks and swaps
    b = torch.randn(3, 6, 2, dtype=dtype)
    _close(*_pair(lambda l_, p_, b_: torch.linalg.ldl_solve(l_, p_, b_, hermitian=hermitian), ld, pivots, b))


def test_diagonal_and_slice_backward_with_negative_dims() -> None:
    """torch.linalg.diagonal's gradient: diagonal_backward calls diagonal_scatter with dim1=-2, dim2=-1, which
    torchax's lowering rejected; x.narrow(-1, ...)'s: slice_backward calls slice_scatter with dim=-1."""
    x = torch.randn(3, 4, 4)
    g = []
    for dev in ("cpu", "tpu"):
        v = x.detach().to(dev).requires_grad_()
        (torch.linalg.diagonal(v, offset=1) * torch.arange(3.0, device=dev)).sum().backward()
        g.append(v.grad)
    _close(*g)
    _close(*_pair(lambda a, s: torch.diagonal_scatter(a, s, 0, -1, -2), x, torch.randn(3, 4)))
    g = []
    for dev in ("cpu", "tpu"):
        v = x.detach().to(dev).requires_grad_()
        (v.narrow(-1, 1, 2) * torch.arange(2.0, device=dev)).sum().backward()
        g.append(v.grad)
    _close(*g)
    _close(*_pair(lambda a, s: torch.slice_scatter(a, s, -1, 1, 3), x, torch.randn(3, 4, 2)))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float32])
@pytest.mark.parametrize("reduce", ["amin", "amax"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_min_max_without_self_on_integers(dtype, reduce, include_self) -> None:
    """include_self=False seeded the scattered positions with +-inf, which integers cannot hold: every amin
    came out INT_MIN on tpu. src is larger than index (only index's extent is read), positions no index
    names keep self."""
    torch.manual_seed(0)
    x = torch.randint(-5, 5, (4, 5)).to(dtype)
    src = torch.randint(-5, 5, (4, 7)).to(dtype)
    index = torch.randint(0, 4, (4, 6))  # column 4 of x is never named
    expected = x.scatter_reduce(1, index, src, reduce, include_self=include_self)
    got = x.to("tpu").scatter_reduce(1, index.to("tpu"), src.to("tpu"), reduce, include_self=include_self)
    op_parity.compare(expected, got)


def test_bool_index_add_and_accumulating_index_put_are_logical_or() -> None:
    """index_add's decomposition accumulates with index_put, whose JAX add refused bool (TpuOpError); CPU
    ORs. Repeated indices included; numeric accumulation is unchanged."""
    x = torch.tensor([False, True, False, False, False])
    index = torch.tensor([1, 3, 3, 0])
    src = torch.tensor([True, False, True, False])
    op_parity.compare(x.index_add(0, index, src), x.to("tpu").index_add(0, index.to("tpu"), src.to("tpu")))
    expected = x.index_put((index,), src, accumulate=True)
    op_parity.compare(expected, x.to("tpu").index_put((index.to("tpu"),), src.to("tpu"), accumulate=True))
    n = torch.arange(5.0)
    op_parity.compare(n.index_add(0, index, src.float()), n.to("tpu").index_add(0, index.to("tpu"), src.float().to("tpu")))


_BOOL_SCATTERS = {
    "scatter_add": lambda x, i, s: x.scatter_add(1, i, s),
    "scatter_reduce_sum": lambda x, i, s: x.scatter_reduce(1, i, s, "sum"),
    "scatter_reduce_sum_no_self": lambda x, i, s: x.scatter_reduce(1, i, s, "sum", include_self=False),
    "scatter_reduce_prod": lambda x, i, s: x.scatter_reduce(1, i, s, "prod"),
    "scatter_reduce_prod_no_self": lambda x, i, s: x.scatter_reduce(1, i, s, "prod", include_self=False),
    "scatter_add_reduce": lambda x, i, s: x.scatter(1, i, s, reduce="add"),
    "scatter_multiply_reduce": lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
    "scatter_value_add": lambda x, i, s: x.scatter(1, i, True, reduce="add"),
    "scatter_value_multiply": lambda x, i, s: x.scatter(1, i, False, reduce="multiply"),
    "masked_index_put_accumulate": lambda x, i, s: torch.ops.aten._unsafe_masked_index_put_accumulate(
        x, i[:, :3] > 0, [i[:, :3], i[:, 3:]], s[:, :3]),
}


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32], ids=str)
@pytest.mark.parametrize("name", sorted(_BOOL_SCATTERS))
def test_accumulating_scatters_on_bool_are_logical(name, dtype) -> None:
    """CPU adds bools as a logical or and multiplies them as a logical and; JAX's add and multiply refuse bool
    (each raised TpuOpError). Repeated indices (4 rows into 5 columns, 6 each) and positions never named
    included; int32 checks the numeric path is unchanged."""
    torch.manual_seed(0)
    x = torch.randint(0, 2, (4, 5)).to(dtype)
    src = torch.randint(0, 2, (4, 7)).to(dtype)
    index = torch.randint(0, 4, (4, 6))
    fn = _BOOL_SCATTERS[name]
    op_parity.compare(fn(x, index, src), fn(x.to("tpu"), index.to("tpu"), src.to("tpu")))


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
def test_svd_and_eigh_values_only_triangles_and_pinv(dtype) -> None:
    """_linalg_svd(compute_uv=False) and _linalg_eigh(compute_v=False) raised (torchax took neither flag:
    svdvals, matrix_rank, the nuclear norm, cond, eigvalsh); eigh reads only its UPLO triangle (JAX symmetrized
    a non-Hermitian input first); pinv(hermitian=True) goes through eigh of the lower triangle as CPU's, and
    honours atol (torchax's took the SVD of the whole matrix)."""
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4, dtype=dtype)
    t = a.to("tpu")
    _close(torch.linalg.svdvals(a), torch.linalg.svdvals(t))
    _close(torch.linalg.matrix_norm(a, "nuc"), torch.linalg.matrix_norm(t, "nuc"))
    for uplo in ("L", "U"):
        _close(torch.linalg.eigvalsh(a, UPLO=uplo), torch.linalg.eigvalsh(t, UPLO=uplo))
    low_rank = a[..., :2] @ a[..., :2].mH
    _close(torch.linalg.matrix_rank(low_rank), torch.linalg.matrix_rank(low_rank.to("tpu")))
    _close(torch.linalg.matrix_rank(low_rank, hermitian=True),
           torch.linalg.matrix_rank(low_rank.to("tpu"), hermitian=True))
    _close(torch.linalg.pinv(a, hermitian=True), torch.linalg.pinv(t, hermitian=True))
    _close(torch.linalg.pinv(a, atol=0.5), torch.linalg.pinv(t, atol=0.5))


@pytest.mark.parametrize("case", ["bins", "range", "weight_density", "edges", "constant_column"])
def test_histogramdd_matches_cpu(case) -> None:
    """torch.histogramdd had no lowering (_histogramdd_bin_edges, _from_bin_cts, _from_bin_tensors): edges per
    dim from the column's min and max (widened when equal) or `range`, the last bin closed, elements outside
    any dim's edges dropped, weights and density as CPU's kernel."""
    torch.manual_seed(0)
    x = torch.randn(40, 3) * 2
    if case == "constant_column":
        x[:, 1] = 0.5
    w = torch.rand(40)
    kwargs = {"bins": [4, 3, 5]}
    if case == "range":
        kwargs["range"] = [-1.0, 1.0, -2.0, 0.5, 0.0, 3.0]
    if case == "weight_density":
        kwargs.update(weight=w, density=True)
    if case == "edges":
        kwargs["bins"] = [torch.tensor([-3.0, -1.0, 0.0, 2.5]), torch.linspace(-2, 2, 6), torch.tensor([0.0, 1.0])]

    def on(dev):
        return {k: ([b.to(dev) for b in v] if k == "bins" and case == "edges" else v.to(dev) if k == "weight" else v)
                for k, v in kwargs.items()}

    expected = torch.histogramdd(x, **kwargs)
    _close(tuple(expected), tuple(torch.histogramdd(x.to("tpu"), **on("tpu"))))


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("driver", [None, "gelsd"])
def test_lstsq_residuals_are_real_for_complex(driver) -> None:
    """CPU's residuals and singular values are real for a complex system (tpu gave complex64)."""
    torch.manual_seed(0)
    a, b = torch.randn(5, 3, dtype=torch.complex64), torch.randn(5, 2, dtype=torch.complex64)
    expected = torch.linalg.lstsq(a, b, driver=driver)
    got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver)
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    _close(expected.solution, got.solution)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32, torch.int64, torch.bool], ids=str)
def test_put_accumulates_repeated_indices(dtype) -> None:
    """put(accumulate=True): repeated and negative indices add up, complex sources keep their imaginary part
    (torchax's put built a float32 buffer and kept one of repeated indices); bool ORs."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=dtype) if dtype.is_floating_point or dtype.is_complex else \
        torch.randint(0, 2, (3, 4)).to(dtype)
    index = torch.tensor([[1, 5, -1], [5, 1, 0]])
    src = x.flatten()[:6].reshape(2, 3).flip(0)
    for acc in (True, False):
        i = index if acc else index[0]
        s = src if acc else src[0]
        _close(x.put(i, s, accumulate=acc), x.to("tpu").put(i.to("tpu"), s.to("tpu"), accumulate=acc))


@pytest.mark.parametrize("compiled", [False, True])
def test_singular_matrices_raise_as_on_cpu(compiled: bool) -> None:
    """The `_ex` forms' info is getrf's (torchax's inv_ex, lu_factor_ex and our solve_ex reported 0 always) and
    eager's _linalg_check_errors raises on it (torchax's was a no-op: not even cholesky raised): a singular
    matrix gave inf with no error, eager and compiled."""
    batch = torch.stack([torch.eye(3), torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])])
    b = torch.ones(2, 3, 1)
    calls = {
        "inv": lambda a: torch.linalg.inv(a),
        "solve": lambda a, b: torch.linalg.solve(a, b),
        "lu_factor": lambda a: torch.linalg.lu_factor(a),
        "cholesky": lambda a: torch.linalg.cholesky(a - 2 * torch.eye(3, device=a.device)),
        "inv_ex": lambda a: torch.linalg.inv_ex(a).info,
        "lu_factor_ex": lambda a: torch.linalg.lu_factor_ex(a).info,
        "solve_ex": lambda a, b: torch.linalg.solve_ex(a, b).info,
    }
    for name, fn in calls.items():
        args = (batch, b) if "solve" in name else (batch,)
        try:
            expected, error = fn(*args), None
        except Exception as exc:  # noqa: BLE001 - CPU's error is the expectation
            expected, error = None, exc
        run = torch.compile(fn, backend="tpu", dynamic=False) if compiled else fn
        if compiled:
            torch._dynamo.reset()
        tpu_args = [a.to("tpu") for a in args]
        if error is not None:
            with pytest.raises(type(error), match=str(error).split(":")[0]):
                run(*tpu_args)
        else:
            assert torch.equal(run(*tpu_args).cpu(), expected), name  # the infos: [0, 2]


def test_complex_logcumsumexp_keeps_cpus_branch() -> None:
    """CPU scans max + log1p(exp(min - max)) in complex128, so a result keeps its largest term's imaginary part
    unwrapped; torchax's log of a cumulative sum wrapped it into (-pi, pi] (64 of 125 OpInfo elements 2 pi off).
    Also -inf and NaN terms, and the dim of a permuted layout."""
    torch.manual_seed(0)
    x = torch.complex(torch.randn(4, 6) * 3, torch.randn(4, 6) * 6)
    x[1, 2] = complex(float("-inf"), 0.0)
    x[2, 3] = complex(float("nan"), 1.0)
    x[3, :2] = complex(float("-inf"), 2.0)
    for dim in (0, 1, -1):
        _close(torch.logcumsumexp(x, dim), torch.logcumsumexp(x.to("tpu"), dim))
        torch._dynamo.reset()
        fn = torch.compile(lambda t, d=dim: torch.logcumsumexp(t, d), backend="tpu", dynamic=False)
        _close(torch.logcumsumexp(x, dim), fn(x.to("tpu")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_lu_solve_every_side_and_adjoint(dtype) -> None:
    """From the right, torchax solved A^H X^T = B^T (and A X^T = B^T with adjoint): right for real A only
    (lu_solve complex64, left=False)."""
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    lu, piv = torch.linalg.lu_factor(a)
    for left in (True, False):
        b = torch.randn(2, 4, 3, dtype=dtype) if left else torch.randn(2, 3, 4, dtype=dtype)
        for adjoint in (False, True):
            want = torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
            _close(want, torch.linalg.lu_solve(lu.to("tpu"), piv.to("tpu"), b.to("tpu"), left=left, adjoint=adjoint))


@pytest.mark.parametrize("compiled", [False, True])
def test_logcumsumexp_accumulates_as_cpu(compiled: bool) -> None:
    """OpInfo's samples (a 1e4 term among ordinary ones): CPU accumulates float32 in double, and the gradient (a
    logcumsumexp of the reversed gradient) came out 1e-3 off in float32; complex64 keeps CPU's branch."""
    (op,) = [o for o in op_parity.ops() if o.name == "logcumsumexp"]
    assert op_parity.check(op, torch.float32, samples=2, compiled=compiled) == op_parity.Result("pass", "pass")
    assert op_parity.check(op, torch.complex64, samples=2, compiled=compiled) == op_parity.Result("pass", None)
