"""Lowerings the OpInfo parity test found missing or wrong (lowering_parity.py): each op on tpu gives CPU's
values and dtype, half-precision inputs included (computed the way CPU's kernel does, not with a wider
tolerance), and gradients where the op has them."""

from __future__ import annotations

import op_parity
import pytest
import torch
import torch.nn.functional as F

IDX = torch.tensor([0, 2, 0, 3])


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3
    return x.to(dtype) if dtype.is_floating_point else x.round().to(dtype)


CASES = {
    # name: (fn, input shapes, dtypes)
    "index_reduce_prod": (lambda x, s: x.index_reduce(0, IDX.to(x.device), s, "prod"), ((5, 3), (4, 3))),
    "index_reduce_mean": (lambda x, s: x.index_reduce(1, IDX.to(x.device), s, "mean", include_self=False),
                          ((3, 5), (3, 4))),
    "index_reduce_amax": (lambda x, s: x.index_reduce(0, IDX.to(x.device), s, "amax"), ((5, 3), (4, 3))),
    "index_reduce_amin": (lambda x, s: x.index_reduce(0, IDX.to(x.device), s, "amin", include_self=False),
                          ((5, 3), (4, 3))),
    "angle": (torch.angle, ((4, 5),)),
    "sgn": (torch.sgn, ((4, 5),)),
    "cumsum": (lambda x: torch.cumsum(x, 1), ((4, 64),)),
    "fmod": (torch.fmod, ((6, 7), (6, 7))),
    "cross": (lambda a, b: torch.linalg.cross(a, b), ((6, 3), (6, 3))),
    "layer_norm": (lambda x: F.layer_norm(x, (16,)), ((4, 8, 16),)),
    "group_norm": (lambda x: F.group_norm(x, 2), ((2, 6, 5),)),
    "batch_norm_train": (lambda x, m, v: F.batch_norm(x, m, v, training=True, momentum=0.5, eps=0.6),
                         ((5, 4, 6), (4,), (4,))),
    "batch_norm_eval": (lambda x, m, v: F.batch_norm(x, m, v.abs(), training=False), ((5, 4, 6), (4,), (4,))),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True), ((2, 3, 7, 5),)),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, 2), ((1, 2, 5, 3, 4),)),
    "as_strided_scatter": (lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (1, 2), 1), ((4, 4), (2, 3))),
    "polygamma0": (lambda x: torch.polygamma(0, x), ((40,),)),
    "polygamma1": (lambda x: torch.polygamma(1, x), ((40,),)),
    "polygamma3": (lambda x: torch.polygamma(3, x), ((40,),)),
    # the gradient multiplies by the Python scalar ln(10): CPU does it in float32 (OPMATH)
    "log10": (lambda x: torch.log10(x.abs() + 0.1), ((40,),)),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2), ((2, 3, 17),)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 1, 1), ((2, 3, 9, 7),)),
    # pointwise ops XLA expands in the half type (CPU: float32, rounded once)
    "asinh": (torch.asinh, ((400,),)),
    "log1p": (lambda x: torch.log1p(x.abs()), ((400,),)),
    "exp2": (lambda x: torch.exp2(x), ((400,),)),
    "gelu": (F.gelu, ((400,),)),
    # softmax's max, sum and result in float32 (CPU's last-dim kernels), forward and backward
    "softmax": (lambda x: F.softmax(x, -1), ((8, 50),)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), ((8, 50),)),
}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
ONLY = {  # dtypes CPU supports for the op, where fewer than FLOATS
    "polygamma3": (torch.float32,),
    "adaptive_max_pool3d": (torch.float32, torch.bfloat16),
}
# Still one half-precision ulp off CPU (left in reports/op_parity.md): layer norm's float16 backward, batch norm's
# bfloat16 training statistics on these inputs.
# avg_pool2d's float16 backward: CPU's kernel adds each window's share into the input gradient in float16, one
# rounding per add in output order; XLA sums the shares in float16 in its own order.
# asinh's float16 backward goes through rsqrt, whose half-precision CPU result is not 1 / sqrt rounded once on
# a few values in 10^5 (not reproduced; XLA's float16 rsqrt is kept, the nearest measured).
KNOWN = {("layer_norm", torch.float16), ("batch_norm_train", torch.bfloat16), ("avg_pool2d", torch.float16),
         ("asinh", torch.float16)}
INTS = {"index_reduce_prod", "index_reduce_mean", "index_reduce_amax", "index_reduce_amin", "angle", "cumsum"}


def _check(name: str, dtype: torch.dtype) -> None:
    fn, shapes = CASES[name]
    grad = dtype.is_floating_point and name not in ("angle", "sgn") and not name.startswith(("index_reduce",
                                                                                             "polygamma"))
    xs = [_rand(s, dtype, seed=i).requires_grad_(grad and i == 0) for i, s in enumerate(shapes)]
    ts = [x.detach().to("tpu").requires_grad_(x.requires_grad) for x in xs]
    expected, actual = fn(*xs), fn(*ts)
    exp_list = list(expected) if isinstance(expected, tuple) else [expected]
    act_list = list(actual) if isinstance(actual, tuple) else [actual]
    assert all(a.device.type == "tpu" for a in act_list)
    op_parity.compare(exp_list, act_list)  # dtype, shape, values within the parity test's tolerances
    if grad:
        w = torch.linspace(0.5, 1.5, exp_list[0].numel()).reshape(exp_list[0].shape)
        (g,) = torch.autograd.grad((exp_list[0].float() * w).sum(), xs[0])
        (tg,) = torch.autograd.grad((act_list[0].float() * w.to("tpu")).sum(), ts[0])
        op_parity.compare(g, tg)


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_cpu(name: str, dtype: torch.dtype) -> None:
    if dtype not in ONLY.get(name, FLOATS):
        pytest.skip(f"CPU has no {name} for {dtype}")
    if (name, dtype) in KNOWN:
        pytest.xfail("one half-precision ulp off CPU")
    _check(name, dtype)


@pytest.mark.parametrize("name", sorted(INTS))
def test_integers_match_cpu(name: str) -> None:
    _check(name, torch.int64)


@pytest.mark.parametrize("n", range(5))
def test_polygamma_poles_and_bool(n: int) -> None:
    """polygamma(n >= 1) at a pole is (-1)^(n+1) inf, as PyTorch's n! zeta(n + 1, x) (even n gave +inf: the
    5 bool pairs, whose False is the pole at 0); digamma is -inf at +0, +inf at -0, NaN at negative integers."""
    x = torch.tensor([0.0, -0.0, -2.0, 0.5, 3.0, -1.5])
    if n == 1:  # CPU's trigamma kernel gives finite values at negative integers (sin(pi x) rounds off 0)
        x = x[x >= 0]
    op_parity.compare(torch.polygamma(n, x), torch.polygamma(n, x.to("tpu")))
    b = torch.tensor([True, False, True])
    op_parity.compare(torch.polygamma(n, b), torch.polygamma(n, b.to("tpu")))


@pytest.mark.parametrize("weight", [None, "half", torch.float32])
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_native_layer_norm_statistics_dtype(dtype: torch.dtype, weight) -> None:
    """CPU saves mean and rstd in the input's dtype, or in the weight's when they differ; the meta kernel's
    float32 statistics (CUDA's) came out on tpu for every half input."""
    x = _rand((3, 4, 8), dtype)
    w = None if weight is None else _rand((8,), dtype if weight == "half" else weight, seed=1)
    b = None if w is None else _rand((8,), w.dtype, seed=2)
    expected = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    on = [None if t is None else t.to("tpu") for t in (x, w, b)]
    op_parity.compare(expected, torch.ops.aten.native_layer_norm(on[0], [8], on[1], on[2], 1e-5))


def test_sign_of_bool() -> None:
    x = torch.tensor([True, False, True])
    assert torch.equal(torch.sign(x.to("tpu")).cpu(), torch.sign(x))


def test_batch_norm_updates_running_stats_like_cpu() -> None:
    """_native_batch_norm_legit (what F.batch_norm reaches in training) writes the running statistics back."""
    x = _rand((6, 3, 4), torch.float32)
    m, v = torch.zeros(3), torch.ones(3)
    tm, tv = m.to("tpu"), v.to("tpu")
    F.batch_norm(x, m, v, training=True, momentum=0.3)
    F.batch_norm(x.to("tpu"), tm, tv, training=True, momentum=0.3)
    op_parity.compare([m, v], [tm, tv])


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5), (5, 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
def test_lu_and_lu_unpack_match_cpu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """linalg.lu (batched, rectangular) and lu_unpack of CPU's packed factors: CPU's P, L, U; L and U's gradients."""
    a = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    op_parity.compare(torch.linalg.lu(a), torch.linalg.lu(a.to("tpu")))
    lu, piv = torch.linalg.lu_factor(a)
    op_parity.compare(torch.lu_unpack(lu, piv), torch.lu_unpack(lu.to("tpu"), piv.to("tpu")))
    if dtype == torch.float32:
        x, t = a.clone().requires_grad_(), a.to("tpu").requires_grad_()
        _, lo, up = torch.linalg.lu(x)
        _, tlo, tup = torch.linalg.lu(t)
        (g,) = torch.autograd.grad(lo.sum() + (up * 2).sum(), x)
        (tg,) = torch.autograd.grad(tlo.sum() + (tup * 2).sum(), t)
        op_parity.compare(g, tg)


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("name", ["linalg.eigvals", "linalg.eig", "linalg.solve", "linalg.solve_ex"])
def test_eigvals_and_solve_gradients_match_cpu(name: str) -> None:
    """_linalg_eigvals (complex inputs) and _linalg_solve_ex's LU outputs, which the eig and solve backwards
    reuse: every OpInfo sample, float32 with gradients and complex64."""
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [op for op in op_db if op_parity.pair_name(op) == name]
    for dtype in (torch.float32, torch.complex64):
        res = op_parity.check(op, dtype, samples=1000)
        assert res.forward == "pass" and res.backward in ("pass", None), (dtype, res)


BIT_EQUAL = {  # computed as CPU's kernels, so equal to the bit (a half ulp is inside the tolerances above)
    "pow2": lambda x: x ** 2, "pow3": lambda x: x ** 3, "pow-2": lambda x: x ** -2, "pow-1": lambda x: x ** -1,
    "pow2.5": lambda x: x ** 2.5, "asinh": torch.asinh, "exp2": torch.exp2, "gelu": F.gelu, "log1p": torch.log1p,
    "x+0.1": lambda x: x + 0.1, "sigmoid": torch.sigmoid, "logit": lambda x: torch.logit(x / 4.5),
    "logit_eps": lambda x: torch.logit(x / 4.5, eps=0.1),
}


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", sorted(BIT_EQUAL))
def test_half_pointwise_bit_equal(name: str, dtype: torch.dtype) -> None:
    x = (torch.rand(20000, generator=torch.Generator().manual_seed(0)) * 4 + 0.01).to(dtype)
    fn = BIT_EQUAL[name]
    assert torch.equal(fn(x.to("tpu")).cpu(), fn(x))
