"""`tpu` behaves as a PyTorch device: creation, movement, modules, printing."""

from __future__ import annotations

import torch


def test_creation_and_movement() -> None:
    t = torch.ones(2, 3, device="tpu")
    assert t.device.type == "tpu" and t.is_tpu and t.device == torch.device("tpu:0")
    assert torch.equal(t.cpu(), torch.ones(2, 3))
    d = torch.tensor([[1, 2], [3, 4]], device="tpu")
    assert d.dtype == torch.int64 and d.cpu().tolist() == [[1, 2], [3, 4]]
    c = torch.arange(6).reshape(2, 3)
    assert torch.equal(c.to("tpu").cpu(), c)
    assert torch.equal(c.tpu().cpu(), c)
    assert torch.zeros(3, device="tpu:0").device.index == 0
    assert torch.full((2,), 7.5, device="tpu").cpu().tolist() == [7.5, 7.5]
    assert torch.equal(torch.arange(5, device="tpu").cpu(), torch.arange(5))


def test_module_to_and_tpu() -> None:
    m = torch.nn.Linear(3, 2)
    m.to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    m2 = torch.nn.Linear(3, 2).tpu()
    assert m2.weight.device.type == "tpu"
    assert m(torch.ones(1, 3, device="tpu")).shape == (1, 2)


def test_print() -> None:
    t = torch.tensor([1.5, -2.0], device="tpu")
    assert repr(t) == "tensor([ 1.5000, -2.0000], device='tpu:0')"
    assert "device='tpu:0'" in str(torch.zeros(2, 2, dtype=torch.int64, device="tpu"))


def test_item_and_tolist() -> None:
    t = torch.tensor([[1.25, 2.0], [3.0, 4.0]], device="tpu")
    assert t[0, 0].item() == 1.25
    assert t.tolist() == [[1.25, 2.0], [3.0, 4.0]]
    assert torch.tensor(7, device="tpu").item() == 7
    assert bool(torch.tensor(True, device="tpu"))
