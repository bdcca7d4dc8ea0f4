"""copy.deepcopy of tpu tensors, views, Parameters and models, compared with the same deepcopy on CPU."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

import hf_tpu  # noqa: F401  (registers tpu and the patches)


def test_deepcopy_in_a_fresh_process_does_not_crash() -> None:
    # the reproducer: it exited with SIGSEGV (139)
    code = "import torch, copy; y = copy.deepcopy(torch.ones(2, device='tpu')); print(y.cpu().tolist())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[1.0, 1.0]"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_tensor_copy_matches_cpu_and_is_independent(dtype: torch.dtype) -> None:
    cpu = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    x = cpu.to("tpu")
    y = copy.deepcopy(x)
    assert y.device.type == "tpu" and y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.cpu(), copy.deepcopy(cpu))
    # writes on either side stay on that side
    y.zero_()
    torch.testing.assert_close(x.cpu(), cpu)
    x.fill_(1)
    assert not y.cpu().bool().any()


def _views_after_deepcopy(device: str) -> tuple[torch.Tensor, ...]:
    base = torch.arange(12.0, device=device).reshape(3, 4)
    col = base[:, 1]
    row = base[2]
    nb, nc, nr = copy.deepcopy([base, col, row])  # one memo: copies share as the originals do
    nc.add_(100)
    nr.mul_(-1)
    lone = copy.deepcopy(col)  # a view copied alone
    lone.zero_()
    return base, col, nb, nc, nr, lone


def test_views_copied_together_still_share_like_cpu() -> None:
    want = _views_after_deepcopy("cpu")
    got = _views_after_deepcopy("tpu")
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g.cpu(), w)
    # the originals did not see the copies' writes
    torch.testing.assert_close(got[0].cpu(), torch.arange(12.0).reshape(3, 4))


def test_copies_in_separate_memos_do_not_share() -> None:
    base = torch.zeros(4, device="tpu")
    view = base[1:3]
    nb = copy.deepcopy(base)
    nv = copy.deepcopy(view)
    nv.fill_(5)
    assert nb.cpu().tolist() == [0, 0, 0, 0]
    assert nv.cpu().tolist() == [5, 5]


def test_requires_grad_grad_and_attributes_are_copied() -> None:
    x = torch.randn(3, device="tpu", requires_grad=True)
    (x * 2).sum().backward()
    x.tag = {"name": "weights"}
    y = copy.deepcopy(x)
    assert y.requires_grad and y.is_leaf
    torch.testing.assert_close(y.grad.cpu(), torch.full((3,), 2.0))
    assert y.grad is not x.grad
    assert y.tag == {"name": "weights"} and y.tag is not x.tag
    # the copy takes part in autograd on its own
    (y * 3).sum().backward()
    torch.testing.assert_close(y.grad.cpu(), torch.full((3,), 5.0))
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))


def test_non_leaf_raises_the_cpu_error() -> None:
    with pytest.raises(RuntimeError, match="graph leaves") as cpu_err:
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
    with pytest.raises(RuntimeError, match="graph leaves") as tpu_err:
        copy.deepcopy(torch.ones(2, device="tpu", requires_grad=True) * 2)
    assert str(cpu_err.value) == str(tpu_err.value)


def test_parameter_copy() -> None:
    p = torch.nn.Parameter(torch.randn(2, 3).to("tpu"))
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device.type == "tpu"
    torch.testing.assert_close(q.cpu(), p.cpu())
    with torch.no_grad():
        q.zero_()
    assert p.detach().cpu().abs().sum() > 0


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # buffers: running stats, num_batches_tracked (int64)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as LM heads are
        self.register_buffer("position_ids", torch.arange(6).expand(1, -1))  # a view buffer, as in BERT

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids + self.position_ids[:, : ids.shape[1]] % 2)
        return self.head(self.norm(h.transpose(1, 2)).transpose(1, 2))


def test_module_copy_matches_cpu_and_keeps_ties(highest: None) -> None:
    torch.manual_seed(0)
    cpu_model = _Tied().eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_copy, tpu_copy = copy.deepcopy(cpu_model), copy.deepcopy(tpu_model)
    assert tpu_copy.head.weight is tpu_copy.emb.weight
    assert all(t.device.type == "tpu" for t in [*tpu_copy.parameters(), *tpu_copy.buffers()])
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(tpu_copy(ids.to("tpu")).cpu(), cpu_copy(ids), rtol=1e-4, atol=1e-4)
    for name, t in tpu_copy.state_dict().items():
        torch.testing.assert_close(t.cpu(), cpu_copy.state_dict()[name])
    # training the copy leaves the original alone
    with torch.no_grad():
        tpu_copy.emb.weight.add_(1)
    torch.testing.assert_close(tpu_model.emb.weight.detach().cpu(), cpu_model.emb.weight.detach())


def test_transformers_model_copy(highest: None) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    copied = copy.deepcopy(model.to("tpu"))
    ids = torch.tensor([[5, 6, 7, 8]])
    out = copied(input_ids=ids.to("tpu")).last_hidden_state.cpu()
    ref = copy.deepcopy(model.to("cpu"))(input_ids=ids).last_hidden_state
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_storage_clone_raises_a_clear_error() -> None:
    x = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match="copy the tensor instead"):
        x.untyped_storage().clone()


def test_to_tpu_keeps_tied_parameters() -> None:
    torch.manual_seed(0)
    cpu = _Tied()
    dev = copy.deepcopy(cpu).to("tpu")
    assert dev.head.weight is dev.emb.weight  # as cpu.to("cuda") keeps it
    ids = torch.tensor([[1, 2, 3]])
    cpu(ids).sum().backward()
    dev(ids.to("tpu")).sum().backward()
    torch.testing.assert_close(dev.emb.weight.grad.cpu(), cpu.emb.weight.grad, rtol=2e-2, atol=2e-2)
