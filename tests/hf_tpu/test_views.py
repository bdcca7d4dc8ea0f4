"""Views at real size: geometry instead of per-element index arrays, checked against CPU PyTorch."""

from __future__ import annotations

import itertools
import random
import tracemalloc

import numpy as np
import pytest
import torch

from hf_tpu import tensor as T
from hf_tpu import views


# ------------------------------------------------------------------ composition against brute force
def _positions(step, frame_positions):
    sizes, strides, off = step
    idx = np.full(sizes, off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(sizes, strides, strict=True)):
        shape = [1] * len(sizes)
        shape[d] = n
        idx = idx + (np.arange(n) * s).reshape(shape)
    return frame_positions.reshape(-1)[idx]


def _random_step(rng, sizes):
    """A view op's geometry over a contiguous frame of `sizes`, as PyTorch's meta kernels give it."""
    meta = torch.empty(sizes, device="meta")
    kind = rng.choice(["t", "slice", "select", "expand", "permute", "view", "unsqueeze", "diagonal"])
    dims = len(sizes)
    if kind == "t" and dims >= 2:
        out = meta.transpose(0, dims - 1)
    elif kind == "slice":
        d = rng.randrange(dims)
        n = sizes[d]
        a = rng.randrange(n)
        out = meta.narrow(d, 0, n)[(slice(None),) * d + (slice(a, n, rng.choice([1, 1, 2, 3])),)]
    elif kind == "select" and dims >= 2:
        d = rng.randrange(dims)
        out = meta.select(d, rng.randrange(sizes[d]))
    elif kind == "expand":
        out = meta.unsqueeze(0).expand(rng.choice([1, 3]), *sizes)
    elif kind == "permute":
        p = list(range(dims))
        rng.shuffle(p)
        out = meta.permute(p)
    elif kind == "view":
        out = meta.view(-1)
    elif kind == "diagonal" and dims >= 2:
        out = meta.diagonal(0, 0, 1)
    else:
        out = meta.unsqueeze(rng.randrange(dims + 1))
    return tuple(out.shape), tuple(out.stride()), out.storage_offset()


def test_compose_matches_brute_force_positions():
    """Any chain of view ops read through views.compose lands on the positions PyTorch's own strided
    arithmetic gives, whether the steps fold into one or stay a chain."""
    rng = random.Random(0)
    folded = chained = 0
    for _ in range(400):
        base = tuple(rng.choice([1, 2, 3, 4, 5]) for _ in range(rng.randrange(1, 4)))
        n = int(np.prod(base))
        view, sizes, frame = None, base, np.arange(n)
        for _ in range(rng.randrange(1, 5)):
            step = _random_step(rng, sizes)
            frame = _positions(step, frame)
            view = views.compose(view, int(np.prod(sizes)), n, *step)
            sizes = step[0]
            got = np.arange(n).reshape(base) if view is None else np.asarray(
                views.read(np.arange(n, dtype=np.float64).reshape(base), view))
            np.testing.assert_array_equal(np.asarray(got).reshape(-1), frame.reshape(-1).astype(np.float64))
        folded += view is not None and len(view) == 1
        chained += view is not None and len(view) > 1
    assert folded > 100  # the common views fold into one step


def test_reshape_across_a_transpose_chains_and_writes_through():
    c = torch.arange(12.0).reshape(3, 4)
    t = c.to("tpu")
    y = t.t().reshape(-1)  # PyTorch lets it be a view on tpu (every tpu tensor says it is contiguous)
    assert len(T.payload(y).view) == 2
    assert torch.equal(y.cpu(), c.t().reshape(-1))
    y[2:7] = -1.0
    flat = c.t().reshape(-1).clone()
    flat[2:7] = -1.0
    assert torch.equal(t.cpu(), flat.reshape(4, 3).t())


# ------------------------------------------------------------------ views of views against CPU
def _chains():
    def ident(x):
        return x

    return {
        "t_slice": lambda x: x.t()[1:, ::2],
        "slice_t": lambda x: x[1:5, 2:].t(),
        "select_of_t": lambda x: x.t()[3],
        "narrow_narrow": lambda x: x.narrow(0, 1, 4).narrow(1, 2, 3),
        "permute_3d": lambda x: x.view(2, 3, 6).permute(2, 0, 1)[1:4],
        "unsqueeze_slice": lambda x: x.unsqueeze(1)[:, :, 2:5].squeeze(1),
        "split_chunk": lambda x: x.split(2, dim=1)[1],
        "diagonal": lambda x: x.diagonal(),
        "unfold": lambda x: x[0].unfold(0, 3, 2),  # overlapping windows: the gather path
        "as_strided": lambda x: x.as_strided((3, 3), (5, 2), 1),
        "whole": ident,
    }


@pytest.mark.parametrize("name", list(_chains()))
def test_view_chain_reads_and_writes_like_cpu(name):
    f = _chains()[name]
    c = torch.randn(6, 6)
    t = c.to("tpu")
    assert torch.equal(f(t).cpu(), f(c))
    if name in ("unfold", "as_strided"):  # overlapping views: PyTorch forbids in-place writes to these
        return
    f(c).mul_(-2).add_(1)
    f(t).mul_(-2).add_(1)
    assert torch.equal(t.cpu(), c)  # the base sees the write
    g = _chains()["t_slice"]
    assert torch.equal(g(t).cpu(), g(c))  # and so does another view of it


def test_expanded_and_transposed_views_feed_ops_like_cpu(highest):
    c = torch.randn(4, 5)
    t = c.to("tpu")
    b = torch.randn(5)
    bt = b.to("tpu")
    cases = [
        lambda x, v: x.t() @ x,
        lambda x, v: v.expand(4, 5) * x,
        lambda x, v: x[:, 1:].t().contiguous().sum(0),
        lambda x, v: torch.nn.functional.linear(x, x[1:3]),
        lambda x, v: x.t()[::2].exp(),
        lambda x, v: v.unsqueeze(0).expand(3, 5).t()[1:] + 1,
    ]
    for f in cases:
        torch.testing.assert_close(f(t, bt).cpu(), f(c, b), rtol=1e-5, atol=1e-5)


def test_a_write_to_the_base_shows_through_existing_views():
    c = torch.randn(5, 5)
    t = c.to("tpu")
    vc, vt = c.t()[1:4], t.t()[1:4]
    assert torch.equal(vt.cpu(), vc)  # read once (cached)
    c[2].fill_(7.0)
    t[2].fill_(7.0)
    assert torch.equal(vt.cpu(), vc)


def test_views_of_a_large_tensor_allocate_no_host_index():
    """`weight.t()`, slices and their reads cost no O(numel) host memory (an int64 index per element was
    8 bytes x 16.8M = 134 MB here)."""
    x = torch.randn(4096, 4096).to("tpu")
    (x.t() + 1).cpu()  # compile the programs outside the measurement
    tracemalloc.start()
    try:
        for _ in range(2):
            views_ = [x.t(), x[::2, 100:], x.t()[5:3000], x[1:].t().unsqueeze(0).expand(2, 4096, 4095)]
            outs = [(v * 2).sum() for v in views_]
            float(outs[0].cpu())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"host allocations peaked at {peak / 1e6:.1f} MB"


# ------------------------------------------------------------------ module moves keep identity
def test_module_moves_keep_tied_weights_and_identity(highest):
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16))
    w = m.lm_head.weight
    params = list(m.parameters())
    m.to("tpu")
    assert m.lm_head.weight is m.transformer.wte.weight is w and w.device.type == "tpu"
    assert all(a is b for a, b in zip(params, m.parameters(), strict=True))
    m.to(torch.float64)
    assert m.lm_head.weight is w and w.dtype == torch.float64
    m.cpu()
    assert m.lm_head.weight is m.transformer.wte.weight is w and w.device.type == "cpu"
    m.tpu()
    assert m.lm_head.weight is w and w.device.type == "tpu"
    # a step updates the one shared weight, as on CPU
    ids = torch.tensor([[1, 2, 3]], device="tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(ids, labels=ids).loss.backward()
    opt.step()
    assert torch.equal(m.lm_head.weight.cpu(), m.transformer.wte.weight.cpu())


def test_module_moves_between_other_devices_are_untouched():
    lin = torch.nn.Linear(3, 3)
    w = lin.weight
    lin.to(torch.float64)  # CPU to CPU: PyTorch's own `.data =` path, identity kept as always
    assert lin.weight is w
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_grad_moves_with_its_parameter():
    lin = torch.nn.Linear(3, 2)
    lin.weight.grad = torch.ones(2, 3)
    lin.to("tpu")
    assert lin.weight.grad.device.type == "tpu" and torch.equal(lin.weight.grad.cpu(), torch.ones(2, 3))


# ------------------------------------------------------------------ factories honour their arguments
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_like_and_new_factories_honour_device_and_dtype(device):
    c = torch.randn(2, 3)
    t = c.to("tpu")
    cases = [
        lambda x: torch.empty_like(x, device=device),
        lambda x: torch.zeros_like(x, device=device, dtype=torch.float64),
        lambda x: torch.ones_like(x, device=device),
        lambda x: torch.full_like(x, 3.0, device=device, dtype=torch.int32),
        lambda x: x.new_zeros((4,), device=device),
        lambda x: x.new_empty((1, 2), device=device, dtype=torch.bfloat16),
        lambda x: x.new_ones((2,), device=device),
    ]
    for f in cases:
        got, want = f(t), f(c)
        assert got.device == want.device and got.dtype == want.dtype and got.shape == want.shape
        if device == "cpu" and f is not cases[0] and f is not cases[5]:
            assert torch.equal(got, want)


def test_like_factories_on_tpu_keep_dtype_arguments():
    t = torch.randn(2, 3).to("tpu")
    for f in (torch.zeros_like, torch.ones_like, torch.empty_like):
        out = f(t, dtype=torch.float16)
        assert out.device.type == "tpu" and out.dtype == torch.float16
    assert torch.equal(torch.ones_like(t, dtype=torch.int64).cpu(), torch.ones(2, 3, dtype=torch.int64))


# ------------------------------------------------------------------ copies in and out
_COPY_PEAK = r"""
import resource, sys, torch
torch.ones(4).to("tpu").cpu()          # JAX and the programs, outside the measurement
x = torch.randn(64 * 1024 * 1024)      # 256 MiB
mb = x.nbytes / 2**20
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t = x.to("tpu")
after_in = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
del x
back = t.cpu()
after_out = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print((after_in - base) / mb, (after_out - base) / mb)
"""


def test_copies_in_and_out_peak_at_one_extra_copy():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _COPY_PEAK], capture_output=True, text=True, check=True)
    grow_in, grow_total = map(float, r.stdout.split())
    assert grow_in < 1.3, f"to('tpu') grew peak RSS by {grow_in:.2f} copies"
    # after `del x`, .cpu() may reuse x's pages: in all, at most one more copy than the two that exist
    assert grow_total < 2.3, f"to('tpu') then .cpu() grew peak RSS by {grow_total:.2f} copies"


def test_int_dtypes_through_views():
    for dt in (torch.int64, torch.bool, torch.bfloat16, torch.int8):
        c = (torch.arange(24) % 5).to(dt).reshape(4, 6)
        t = c.to("tpu")
        for f in (lambda x: x.t()[1:], lambda x: x[:, ::3], lambda x: x.unsqueeze(0).expand(2, 4, 6)):
            assert torch.equal(f(t).cpu(), f(c))


@pytest.mark.parametrize("shape", list(itertools.product([1, 3], [1, 4])))
def test_degenerate_shapes(shape):
    c = torch.randn(*shape)
    t = c.to("tpu")
    for f in (lambda x: x.t(), lambda x: x[0], lambda x: x[:, :0], lambda x: x.expand(2, *shape)[1]):
        assert torch.equal(f(t).cpu(), f(c))


def test_views_of_empty_tensors_like_cpu():
    # A view of a view with a zero-size dim used to divide by the empty frame's zero stride (GLM-5-Next's
    # rope head of width 0 in the full-zoo sweep: ZeroDivisionError in eager).
    c = torch.zeros(2, 0, 4)
    t = c.to("tpu")
    chains = (lambda x: x.transpose(0, 2).reshape(4, 0, 2), lambda x: x.view(2, 0, 2, 2).view(2, 1, 0, 4),
              lambda x: x[:, :, 1:3].view(2, 0, 2), lambda x: x.unsqueeze(1).view(2, 1, 1, 0, 4),
              lambda x: x.permute(1, 0, 2).reshape(0, 8).t())
    for f in chains:
        assert f(t).shape == f(c).shape and torch.equal((f(t) + 1).cpu(), f(c) + 1)
        f(t).add_(1)  # writes through an empty chain are no-ops, as on CPU
    w_c, w_t = torch.ones(3, 4), torch.ones(3, 4, device="tpu")
    for w in (w_c, w_t):
        w[1:1].view(0, 2, 2).mul_(5)
    assert torch.equal(w_t.cpu(), w_c)


@pytest.mark.parametrize("name,f", [
    ("transpose_", lambda x: x.transpose_(0, 1)),
    ("t_", lambda x: x.t_()),
    ("unsqueeze_", lambda x: x.unsqueeze_(1)),
    ("squeeze_", lambda x: x.unsqueeze_(0).squeeze_(0)),
    ("as_strided_", lambda x: x.as_strided_((2, 3), (1, 4), 1)),
])
def test_inplace_view_ops_like_cpu(name, f):
    c = torch.randn(4, 6)
    t = c.to("tpu")
    base_c, base_t = c, t
    rc, rt = f(c), f(t)
    assert rt is t and rt.shape == rc.shape
    assert torch.equal(rt.cpu(), rc)
    rc.mul_(3)
    rt.mul_(3)
    assert torch.equal(rt.cpu(), rc)
    assert torch.equal(base_t.cpu(), base_c)
