"""Pairs of the OpInfo parity run that passed in eager but failed through torch.compile(backend="tpu"), each
against CPU in a compiled function (one small graph each)."""

from __future__ import annotations

import pytest
import torch

import op_parity

F = torch.nn.functional


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu", dynamic=False)


def _check(fn, *args) -> None:
    expected = fn(*args)
    op_parity.compare(expected, _compiled(fn)(*[a.to("tpu") for a in args]))


def test_decomposition_only_in_pytorchs_full_table() -> None:
    """ldexp.Tensor has a decomposition in PyTorch's table but not among the core ATen ones compiled graphs
    used: it failed to compile with NoLowering while eager decomposed it."""
    _check(torch.ldexp, torch.tensor([1.5, -2.0, 3.0]), torch.tensor([2, -1, 0]))


def test_integer_and_bool_inputs_of_float_ops_promoted_in_graphs() -> None:
    """Eager promotes them before the lowering; a graph handed the bool array to JAX's float function."""
    _check(torch.special.bessel_j1, torch.tensor([True, False, True]))
    _check(torch.special.bessel_j0, torch.arange(-3, 4))


def test_compiled_code_may_fork_the_tpu_rng() -> None:
    """PyTorch's OpInfo runs `item` inside fork_rng: Dynamo traced the tpu generator's state (a NumPy view of
    the JAX key) and failed; the state functions now run eagerly."""

    def fn(x):
        with torch.random.fork_rng(devices=["tpu:0"], device_type="tpu"):
            return x * 2

    _check(fn, torch.tensor([1.0, 2.0]))


def test_max_unpool_is_one_scatter() -> None:
    """torchax's lowering read every index on the host: a tracer error in a graph."""
    x = torch.randn(2, 3, 4, 4, 4)
    out, idx = F.max_pool3d(x, 2, stride=1, return_indices=True)  # overlapping windows: repeated indices
    _check(lambda o, i: F.max_unpool3d(o, i, 2, stride=1, output_size=x.shape[-3:]), out, idx)
    out, idx = F.max_pool2d(x[0], 2, return_indices=True)
    _check(lambda o, i: F.max_unpool2d(o, i, 2), out, idx)


def _every_positive_half(dtype: torch.dtype) -> torch.Tensor:
    """Every positive normal value of the half type, in order (float16: 30,720 values; bfloat16: a stride)."""
    if dtype == torch.float16:
        bits = torch.arange(0x0400, 0x7C00, dtype=torch.int32)
    else:
        bits = torch.arange(0x0080, 0x7F80, 5, dtype=torch.int32)
    return bits.to(torch.int16).view(dtype)


def _bits_equal(expected: torch.Tensor, actual: torch.Tensor) -> None:
    """Bit-equal: the lowering is CPU's kernel, and 1 ulp is inside OpInfo's float16 tolerance (rtol 1e-3) for
    most values, so a tolerance would hide the rounding this checks."""
    actual = actual.cpu()
    assert expected.dtype == actual.dtype
    diff = (expected != actual).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} of {expected.numel()} differ, first at {diff[:5].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 25, 33, 100, None])
def test_half_rsqrt_is_cpus_vectorised_and_scalar_loops(dtype, n) -> None:
    """CPU's half rsqrt rounds differently in its vectorised loop (1 / sqrt in float32, rounded once) and its
    scalar tail (sqrt rounded to the half type first), so which elements differ from float32-once depends on
    the tensor's length. Eager used XLA's half rsqrt (the tail's way: off on ~27% of a long tensor), graphs
    computed it the vectorised way (acos's float16 gradient failed compiled only on OpInfo's short samples)."""
    x = _every_positive_half(dtype)
    x = x if n is None else x[1000:1000 + n]
    expected = torch.rsqrt(x)
    _bits_equal(expected, torch.rsqrt(x.to("tpu")))
    _bits_equal(expected, _compiled(torch.rsqrt)(x.to("tpu")))


def test_acos_half_backward_compiled() -> None:
    """acos's gradient is grad * -rsqrt(1 - x * x): the OpInfo pair that failed compiled only. The backward
    graph AOTAutograd compiles holds the rsqrt. On AVX-512 hosts XLA:CPU merged the float16 `1 - x * x` into
    one fused multiply-add (xla_options.fuses_half_multiply_adds): 2 of 20 elements 2 ulps off CPU."""
    x = torch.linspace(-0.95, 0.95, 20).half()
    grad = torch.linspace(-1, 1, 20).half()
    leaf = x.clone().requires_grad_()
    torch.acos(leaf).backward(grad)
    on_tpu = x.to("tpu").requires_grad_()
    _compiled(torch.acos)(on_tpu).backward(grad.to("tpu"))
    _bits_equal(leaf.grad, on_tpu.grad)


def test_float16_steps_keep_their_roundings_in_graphs() -> None:
    """Each float16 step of a compiled graph rounds as CPU's eager kernels do, on hosts whose XLA:CPU would
    merge a multiply, a negation and an add into one float16 FMA (the probe says which this host is) and on
    the others; bfloat16 likewise."""
    from hf_tpu import xla_options

    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        x, y = torch.randn(4096).to(dtype), torch.randn(4096).to(dtype)
        fn = lambda a, b: -(a * a) + b * 3 + 1  # noqa: E731
        _bits_equal(fn(x, y), _compiled(fn)(x.to("tpu"), y.to("tpu")))
    assert isinstance(xla_options.fuses_half_multiply_adds(), bool)


def _addcdiv(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
    return torch.addcdiv(x, t1, t2, value=0.7)


def _written_out(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
    return x + (t1 / t2) * 0.7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_addcdiv_half_compiled_rounds_once(dtype) -> None:
    """Dynamo traces addcdiv(value=v) as div, mul, add (three half roundings); CPU rounds once. The same
    arithmetic written out by the user is three ops on CPU too, and stays so."""
    torch.manual_seed(0)
    x, t1 = torch.randn(1000).to(dtype), torch.randn(1000).to(dtype)
    t2 = (torch.rand(1000) + 0.5).to(dtype)
    on_tpu = [v.to("tpu") for v in (x, t1, t2)]
    _bits_equal(_addcdiv(x, t1, t2), _compiled(_addcdiv)(*on_tpu))
    _bits_equal(_addcdiv(x, t1, t2), _addcdiv(*on_tpu))
    _bits_equal(_written_out(x, t1, t2), _compiled(_written_out)(*on_tpu))
    # through a wrapper whose source line does not name addcdiv (OpInfo's op(...)): Dynamo's handle_addcdiv took
    # it apart and the graph rewrite could not tell (patches/torch_patches.py, tpu_addcdiv_whole)
    _bits_equal(_addcdiv(x, t1, t2), _compiled(lambda *a: _call(torch.addcdiv, *a, value=0.7))(*on_tpu))


def _call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_times_python_float_uses_its_float32_value(dtype) -> None:
    """CPU's reduced-float mul and div take a scalar second operand at its float32 value; rounding it to the
    half type first (as add's wrapped scalar is) put 35-50% of the elements of x * 0.1 and x / 0.7 1 ulp off,
    eager and compiled."""
    torch.manual_seed(0)
    x = torch.randn(2000).to(dtype)
    for fn in (lambda t: t * 0.1, lambda t: t / 0.7, lambda t: 0.7 / t, lambda t: t + 0.1, lambda t: t * 3):
        _bits_equal(fn(x), fn(x.to("tpu")))
        _bits_equal(fn(x), _compiled(fn)(x.to("tpu")))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("params", ["half", "float32"])
@pytest.mark.parametrize("training", [True, False])
def test_half_batch_norm_compiled_keeps_cpus_statistics(dtype, params, training) -> None:
    """PyTorch's decomposition (what fake tensors run) gives float32 saved statistics for a half input on any
    device but CPU, and the running statistics in eval where CPU gives empty ones; CPU keeps the parameters'
    dtype. Compiled, the float16 OpInfo pairs failed with "Cannot cast array data from float16 to float32"."""
    torch.manual_seed(0)
    pdt = dtype if params == "half" else torch.float32
    x = torch.randn(3, 4, 5).to(dtype)
    w, b, rm = torch.randn(4).to(pdt), torch.randn(4).to(pdt), torch.randn(4).to(pdt)
    rv = (torch.rand(4) + 0.5).to(pdt)

    def fn(x, w, b, rm, rv):
        return torch.ops.aten.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)

    _check(fn, x, w, b, rm, rv)
    op_parity.compare(fn(x, w, b, rm, rv), fn(*[t.to("tpu") for t in (x, w, b, rm, rv)]))  # eager as well


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_batch_norm_module_trains_compiled(dtype) -> None:
    """A half BatchNorm1d's compiled training step (functionalized: _native_batch_norm_legit_functional, and
    its backward from the saved half statistics) against CPU."""
    torch.manual_seed(0)
    x = torch.randn(6, 4, 5).to(dtype)
    grad = torch.randn(6, 4, 5).to(dtype)

    def grads(device: str, compiled: bool):
        bn = torch.nn.BatchNorm1d(4).to(dtype).to(device)
        inp = x.detach().clone().to(device).requires_grad_()
        fn = _compiled(bn) if compiled else bn
        fn(inp).backward(grad.to(device))
        return [inp.grad.cpu(), bn.weight.grad.cpu(), bn.bias.grad.cpu(), bn.running_mean.cpu(), bn.running_var.cpu()]

    expected, compiled = grads("cpu", False), grads("tpu", True)
    op_parity.compare(expected, compiled)
    op_parity.compare(expected, grads("tpu", False))  # eager too (hf_tpu/batch_norm.py: CPU's kernel)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("params", ["none", "half", "float32"])
def test_half_layer_norm_compiled_keeps_cpus_statistics(dtype, params) -> None:
    """PyTorch's fake-tensor rule for native_layer_norm gives a half input's mean and rstd in its dtype on CPU
    only, float32 on any other device, while CPU's kernel (and the lowering) keep the half dtype (the weight's
    when it differs). Compiled, the OpInfo pairs native_layer_norm:bfloat16/float16 failed with "Cannot cast
    array data from dtype(bfloat16) to dtype('float32')"; the input's gradient reads the saved statistics
    too. (The half weight's gradient is left out: 1 ulp off CPU's on a few elements in eager as well.)"""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5).to(dtype).requires_grad_()
    w = b = None
    if params != "none":
        pdt = dtype if params == "half" else torch.float32
        w, b = torch.randn(4, 5).to(pdt).requires_grad_(), torch.randn(4, 5).to(pdt).requires_grad_()

    def fn(x, w, b):
        return torch.ops.aten.native_layer_norm(x, (4, 5), w, b, 1e-5)

    def run(f, *args):
        out = f(*args)
        grad = torch.autograd.grad(out[0].float().mul(op_parity._weights(out[0])).sum(), args[0])[0]
        return [t.detach().cpu() for t in out], grad.cpu()

    tpu = [None if a is None else a.detach().to("tpu").requires_grad_() for a in (x, w, b)]
    op_parity.compare(run(fn, x, w, b), run(_compiled(fn), *tpu))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_renorm_compiled(dtype) -> None:
    """renorm has no lowering; compiled, its decomposition (torch._refs.renorm) converts dtypes with
    prims.convert_element_type, which had none either: the OpInfo pairs renorm:bfloat16/float16 failed with
    BackendCompilerFailed (NoLowering)."""
    torch.manual_seed(0)
    x = torch.randn(4, 5, 3).to(dtype)
    _check(lambda t: torch.renorm(t, 2, 1, 0.5), x)
    _check(lambda t: torch.ops.prims.convert_element_type(t, torch.float32) * 2, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_batch_norm_with_update_compiled(dtype) -> None:
    """_batch_norm_with_update (F.batch_norm in training) reaches graphs functionalized; PyTorch's decomposition
    of it rounded a half output differently from CPU's kernel (compiled OpInfo pairs
    _batch_norm_with_update:bfloat16/float16: 0.125 off). Output, saved statistics, reserve, running
    statistics and the input's gradient against CPU."""
    torch.manual_seed(0)
    x = torch.randn(5, 5, 5).to(dtype)
    w, b, rm = torch.randn(5).to(dtype), torch.randn(5).to(dtype), torch.randn(5).to(dtype)
    rv = (torch.rand(5) + 0.5).to(dtype)

    def run(fn, x, w, b, rm, rv):
        x = x.detach().clone().requires_grad_()
        out = fn(x, w, b, rm, rv)
        grad = torch.autograd.grad(out[0].float().mul(op_parity._weights(out[0])).sum(), x)[0]
        return [t.detach().cpu() for t in out], rm.cpu(), rv.cpu(), grad.cpu()

    def fn(x, w, b, rm, rv):
        return torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.5, 0.6)

    expected = run(fn, x, w, b, rm.clone(), rv.clone())
    op_parity.compare(expected, run(_compiled(fn), *[t.to("tpu") for t in (x, w, b, rm, rv)]))


def test_linalg_error_checks_compiled() -> None:
    """PyTorch runs linalg.inv/solve/cholesky/lu_factor/ldl_factor/tensorinv as their _ex forms plus an effectful
    aten._linalg_check_errors(info), which a compiled graph holds as with_effects: it was called on a JAX tracer
    ("Expected a value of type 'Tensor' for argument 'info'", 18 compiled OpInfo pairs, eig/eigvals backward too).
    Now the graph returns the info and it is checked after the program: CPU's results, and CPU's error for a
    matrix that is not positive definite (cholesky's lowering computes potrf's info; inv's torchax lowering
    reports 0 always, so a singular matrix gives no error there, compiled or eager)."""
    torch.manual_seed(0)
    a = torch.randn(3, 4, 4)
    spd = a @ a.mT + torch.eye(4)
    b = torch.randn(3, 4, 2)
    _check(torch.linalg.inv, a)
    _check(torch.linalg.solve, a, b)
    _check(torch.linalg.cholesky, spd)
    _check(lambda m: torch.linalg.lu_factor(m), a)
    not_pd = torch.stack([torch.eye(3), -torch.eye(3)])
    with pytest.raises(RuntimeError) as cpu:
        torch.linalg.cholesky(not_pd)
    with pytest.raises(RuntimeError) as tpu:
        _compiled(torch.linalg.cholesky)(not_pd.to("tpu"))
    assert str(tpu.value) == str(cpu.value)


def test_linalg_error_check_graphs_across_processes(tmp_path) -> None:
    """A graph with effect tokens (the linalg checks) saved by the graph cache and loaded by a second process
    ran without its token input (StopIteration: compiled linalg.inv on complex64, inference); it is not saved
    now, and both processes give CPU's result."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import torch, hf_tpu\n"
            "torch.manual_seed(0)\n"
            "a = torch.randn(3, 4, 4, dtype=torch.complex64)\n"
            "out = torch.compile(torch.linalg.inv, backend='tpu', dynamic=False)(a.to('tpu')).cpu()\n"
            "torch.testing.assert_close(out, torch.linalg.inv(a), rtol=1e-4, atol=1e-4)\n")
    env = {**os.environ, "HF_TPU_COMPILE_CACHE": "1", "HF_TPU_CACHE_DIR": str(tmp_path / "xla"),
           "HF_TPU_GRAPH_CACHE_DIR": str(tmp_path / "graphs"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("HF_TPU_SHARED_CACHE_DIR", None)
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]


def test_declared_unsupported_ops_raise_the_declared_error_compiled() -> None:
    """to_sparse (no meta kernel: fake tensors ran it on data-less tpu tensors) and hash_tensor (a uint64 result:
    NoLowering, wrapped in BackendCompilerFailed) crashed compiled where eager raises the declared error (11
    pairs of the compiled whole-database run). Now the same error, and the parity run counts them apart."""
    from hf_tpu import dtypes, errors

    x = torch.randn(3, 3)
    with pytest.raises(errors.Unsupported, match="_to_sparse"):
        _compiled(lambda t: t.to_sparse())(x.to("tpu"))
    with pytest.raises(errors.Unsupported, match="_to_sparse_csr"):
        _compiled(lambda t: t.to_sparse_csr() if t.sum() > -1e9 else t)(x.to("tpu"))
    with pytest.raises(dtypes.DeclaredUnsupportedDtype, match="uint64"):
        _compiled(torch.hash_tensor)(x.to("tpu"))
    ops = {op_parity.pair_name(o): o for o in op_parity.ops() if o.name in ("to_sparse", "hash_tensor")}
    for name, dtype in (("to_sparse", torch.float32), ("to_sparse", torch.bool), ("hash_tensor", torch.float32),
                        ("hash_tensor", torch.int64)):
        res = op_parity.check(ops[name], dtype, samples=2, compiled=True)
        assert res.forward.startswith("unsupported: "), (name, dtype, res)


def test_ops_without_a_meta_kernel_in_pytorch_compile() -> None:
    """geqrf, histogram and histogramdd have no meta kernel in PyTorch: fake tensors ran them on data-less tpu
    tensors and Dynamo failed ("RuntimeError when making fake tensor call"); hf_tpu/meta_kernels.py gives the
    CPU kernels' shapes, and the compiled results are CPU's."""
    torch.manual_seed(0)
    _check(torch.geqrf, torch.randn(2, 5, 3))
    _check(lambda x: torch.histogram(x, bins=4, range=(-2.0, 2.0)), torch.randn(20))
    _check(lambda x, b: torch.histogram(x, bins=b), torch.randn(20), torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    _check(lambda x: torch.histogramdd(x, bins=[3, 2]), torch.randn(10, 2))
    _check(lambda x: torch.histogramdd(x, bins=[torch.tensor([-1.0, 0.0, 1.0], device=x.device),
                                                torch.tensor([-2.0, 2.0], device=x.device)]), torch.randn(10, 2))
