"""Regression tests for the hand lowerings of hf_tpu/lowering_ops.py, each from a zoo entry that failed in both
modes (issue 13's sample): torch.eye (MM-Grounding-DINO), searchsorted(right=True) (MusicFlamingo), the fused
LSTM cell (Parakeet RNN-T) and its GRU sibling. CPU PyTorch is the oracle, eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo


def _both_modes(fn, *inputs: torch.Tensor):
    """fn on CPU, then on tpu eager and compiled: (want, eager, compiled), tpu results moved to CPU."""
    want = fn(*inputs)
    dev = [x.to("tpu") for x in inputs]
    eager = fn(*dev)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu", fullgraph=True)(*dev)
    return want, eager.cpu(), compiled.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int64])
def test_eye_on_tpu(dtype: torch.dtype) -> None:
    # MM-Grounding-DINO: torch.eye(seq_len, device=device, dtype=torch.bool); PyTorch's eye makes a CPU tensor
    # inside eye.out, which dispatch then could not store into the tpu output
    for shape in ((5,), (3, 4)):
        got = torch.eye(*shape, device="tpu", dtype=dtype)
        assert got.dtype == dtype and got.device.type == "tpu"
        assert torch.equal(got.cpu(), torch.eye(*shape, dtype=dtype))
    want, eager, compiled = _both_modes(lambda x: x + torch.eye(3, 4, device=x.device), torch.ones(3, 4))
    assert torch.equal(eager, want) and torch.equal(compiled, want)


def test_range_on_tpu() -> None:
    for args in ((0, 5), (0, 1, 0.3), (2, -3, -1.5)):
        torch.testing.assert_close(torch.range(*args, device="tpu").cpu(), torch.range(*args))


@pytest.mark.parametrize("kwargs", [{}, {"right": True}, {"side": "right"}, {"side": "left"}])
def test_searchsorted_keywords_and_batches(kwargs: dict) -> None:
    # MusicFlamingo: torch.searchsorted(boundaries, values, right=True); torchax's lowering took no keywords
    # and only a 1-D sequence
    seq1 = torch.tensor([0.0, 1.0, 1.0, 2.0, 5.0])
    seq2 = torch.tensor([[1.0, 2.0, 2.0, 3.0], [0.0, 5.0, 5.0, 9.0]])
    vals2 = torch.tensor([[2.0, 3.0, 0.5], [5.0, 10.0, -1.0]])
    for seq, vals in ((seq1, torch.tensor([[1.0, 2.0], [5.0, -1.0]])), (seq2, vals2)):
        want, eager, compiled = _both_modes(lambda s, v: torch.searchsorted(s, v, **kwargs), seq, vals)
        assert eager.dtype == torch.int64
        assert torch.equal(eager, want) and torch.equal(compiled, want)


def test_searchsorted_out_int32_sorter_and_scalar() -> None:
    seq = torch.tensor([[3.0, 1.0, 2.0], [9.0, 0.0, 5.0]])
    sorter = seq.argsort(dim=-1)
    vals = torch.tensor([[2.0, 2.5], [5.0, 1.0]])
    want = torch.searchsorted(seq, vals, sorter=sorter, out_int32=True, right=True)
    got = torch.searchsorted(seq.to("tpu"), vals.to("tpu"), sorter=sorter.to("tpu"), out_int32=True, right=True)
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), want)
    s1 = torch.arange(5.0)
    assert torch.searchsorted(s1.to("tpu"), 2.0, right=True).item() == torch.searchsorted(s1, 2.0, right=True).item()


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_cells_forward_and_backward(highest, cls, bias: bool) -> None:
    # Parakeet RNN-T's prediction network (nn.LSTM): on PrivateUse1 PyTorch runs the CUDA-only fused cell
    # kernels (_thnn_fused_lstm_cell / _thnn_fused_gru_cell), which had no lowering
    torch.manual_seed(0)
    m = cls(5, 7, bias=bias)
    mt = copy.deepcopy(m).to("tpu")
    x = torch.randn(3, 5) if "Cell" in cls.__name__ else torch.randn(4, 3, 5)
    xt = x.to("tpu").requires_grad_()
    x.requires_grad_()
    first = lambda y: y[0] if isinstance(y, tuple) else y  # noqa: E731
    y, yt = first(m(x)), first(mt(xt))
    y.sin().sum().backward()
    yt.sin().sum().backward()
    torch.testing.assert_close(yt.cpu(), y.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-6, rtol=1e-5)
    for p, q in zip(m.parameters(), mt.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-5)


def test_lstm_cell_compiled(highest) -> None:
    torch.manual_seed(0)
    m = torch.nn.LSTMCell(5, 7).eval()
    x = torch.randn(3, 5)
    with torch.no_grad():
        want = m(x)
        torch._dynamo.reset()
        got = torch.compile(copy.deepcopy(m).to("tpu"), backend="tpu")(x.to("tpu"))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", [torch.nn.GRUCell, torch.nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_gru_compiled_forward_and_backward(highest, cls, bias: bool) -> None:
    # _thnn_fused_gru_cell had no meta kernel (PyTorch has one for the LSTM cell only): a compiled graph with a
    # GRU could not be traced (SLANet/SLANeXt compiled: compile_fail "RuntimeError when making fake tensor call")
    torch.manual_seed(0)
    m = cls(5, 7, bias=bias)
    x = torch.randn(3, 5) if cls is torch.nn.GRUCell else torch.randn(4, 3, 5)
    first = lambda y: y[0] if isinstance(y, tuple) else y  # noqa: E731
    x.requires_grad_()
    first(m(x)).sin().sum().backward()
    torch._dynamo.reset()
    mt = copy.deepcopy(m).to("tpu")
    mt.zero_grad()
    xt = x.detach().to("tpu").requires_grad_()
    yt = torch.compile(lambda v: first(mt(v)).sin().sum(), backend="tpu")(xt)
    yt.backward()
    torch.testing.assert_close(yt.cpu(), first(m(x)).sin().sum().detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-6, rtol=1e-5)
    for p, q in zip(m.parameters(), mt.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("forward_only", [False, True])
def test_embedding_bag_like_cpu(forward_only):
    # torchax's lowering ignored per_sample_weights (Kimi K2.5's position interpolation was wrong in eager in the
    # full-zoo sweep) and walked the offsets in numpy (a tracer error when compiled)
    import itertools

    op = torch.ops.aten._embedding_bag_forward_only.default if forward_only else torch.ops.aten._embedding_bag.default
    torch.manual_seed(0)
    w, i = torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    cases = ((torch.tensor([0, 4, 4, 6]), False), (torch.tensor([0, 4, 4, 6, 8]), True))
    for mode, psw, pad, (o, last) in itertools.product((0, 1, 2), (False, True), (-1, 4), cases):
        if psw and mode != 0:
            continue  # CPU allows per-sample weights in sum mode only
        p = torch.rand(8) if psw else None
        ref = op(w, i, o, False, mode, False, p, last, pad)
        got = op(w.to("tpu"), i.to("tpu"), o.to("tpu"), False, mode, False, None if p is None else p.to("tpu"),
                 last, pad)
        for k, (a, b) in enumerate(zip(ref, got, strict=True)):
            b = b.cpu()
            assert a.shape == b.shape, (mode, psw, pad, last, k)
            close = torch.allclose(a, b, atol=1e-6) if a.is_floating_point() else torch.equal(a, b)
            assert close, (mode, psw, pad, last, k, a, b)


def test_embedding_bag_with_weights_compiles():
    x, w, ps = torch.randint(0, 10, (4, 3)), torch.randn(10, 3), torch.rand(4, 3)
    ref = torch.nn.functional.embedding_bag(x, w, per_sample_weights=ps, mode="sum")
    f = torch.compile(lambda x, w, ps: torch.nn.functional.embedding_bag(x, w, per_sample_weights=ps, mode="sum"),
                      backend="tpu")
    assert torch.allclose(f(x.to("tpu"), w.to("tpu"), ps.to("tpu")).cpu(), ref, atol=1e-6)


def test_repeat_interleave_with_output_size_compiles():
    # Kimi K2.5's vision tower: repeat_interleave(arange, counts, output_size=n) in a compiled graph
    counts = torch.tensor([2, 0, 3])

    def f(c):
        return torch.repeat_interleave(torch.arange(3, device=c.device), c, output_size=5) * 2

    ref = f(counts)
    assert torch.equal(f(counts.to("tpu")).cpu(), ref)  # eager
    assert torch.equal(torch.compile(f, backend="tpu", fullgraph=True)(counts.to("tpu")).cpu(), ref)
