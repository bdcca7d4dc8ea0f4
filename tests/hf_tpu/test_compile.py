"""torch.compile(backend="tpu"): one whole graph, one XLA program per shape, forward and backward."""

from __future__ import annotations

import torch
import torch._dynamo

import hf_tpu


def _fresh() -> None:
    torch._dynamo.reset()
    hf_tpu.reset_compile_stats()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        att = torch.softmax(h @ h.transpose(-1, -2) / 4.0, dim=-1)
        return x + att @ h


def test_compiled_matches_cpu_as_one_graph(highest) -> None:
    _fresh()
    torch.manual_seed(0)
    cpu = Block().eval()
    dev = Block().eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("tpu")
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(dev, backend="tpu")
    with torch.no_grad():
        out = compiled(x.to("tpu"))
        again = compiled(x.to("tpu"))
        expected = cpu(x)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again.cpu(), expected, rtol=1e-5, atol=1e-5)
    stats = hf_tpu.compile_stats()
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0
    assert stats["compilations"] == 1  # the second call reused the program


def test_new_shape_compiles_again_static(highest) -> None:
    _fresh()
    f = torch.compile(lambda a, b: torch.relu(a @ b) + 1, backend="tpu")
    for n in (3, 3, 5, 5, 7):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.testing.assert_close(f(a.to("tpu"), b.to("tpu")).cpu(), torch.relu(a @ b) + 1)
    stats = hf_tpu.compile_stats()
    assert stats["compilations"] == 3  # one per distinct shape, none for repeats
    import torch._dynamo.config as cfg

    assert cfg.automatic_dynamic_shapes is False  # static shapes: no symbolic recompiles


def test_backward_matches_cpu(highest) -> None:
    _fresh()
    torch.manual_seed(0)
    cpu = Block()
    dev = Block()
    dev.load_state_dict(cpu.state_dict())
    dev.to("tpu")
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(dev, backend="tpu")
    compiled(x.to("tpu")).pow(2).mean().backward()
    cpu(x).pow(2).mean().backward()
    for p, pt in zip(cpu.parameters(), dev.parameters(), strict=True):
        assert pt.grad.device.type == "tpu"
        torch.testing.assert_close(pt.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6)
    stats = hf_tpu.compile_stats()
    assert stats["graphs"] == 1 and stats["compilations"] == 2  # forward and backward programs


def test_graph_breaks_are_counted(highest) -> None:
    _fresh()

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    out = torch.compile(f, backend="tpu")(torch.ones(3, device="tpu"))
    assert out.cpu().tolist() == [3.0, 3.0, 3.0]
    stats = hf_tpu.compile_stats()
    assert stats["graph_breaks"] >= 1 and stats["graphs"] == 2


def test_input_mutation_is_written_back(highest) -> None:
    _fresh()

    def f(cache, pos, v):
        cache.index_copy_(0, pos, v)
        return cache.sum()

    cache = torch.zeros(4, 2, device="tpu")
    total = torch.compile(f, backend="tpu")(cache, torch.tensor([1], device="tpu"), torch.ones(1, 2, device="tpu"))
    assert total.cpu().item() == 2.0
    assert cache.cpu().tolist() == [[0, 0], [1, 1], [0, 0], [0, 0]]


def test_eager_ops_after_a_graph_break_are_not_traced_by_dynamo(highest) -> None:
    """After a data-dependent graph break, the rest runs eagerly through our kernels: Dynamo must not
    try to trace hf_tpu's dispatch (it used to, failing with "'NoneType' object has no attribute ...")."""
    _fresh()

    def f(x):
        y = x * 2
        n = int(torch.nonzero(y > 0).shape[0])  # data-dependent: a graph break
        return (y + n).sum()

    x = torch.randn(8)
    out = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert hf_tpu.compile_stats()["graph_breaks"] >= 1
