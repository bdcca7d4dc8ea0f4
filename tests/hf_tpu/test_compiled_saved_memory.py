"""What a compiled training graph saves for its backward (hf_tpu/compile_options.partition_fn): AOTAutograd's
min-cut partitioner saves the fewest bytes it can and recomputes cheap ops in the backward program, where
PyTorch's default partitioner saved every intermediate the backward reads (GPT-2 under bfloat16 autocast: the
float32 MLP and attention intermediates, the logits twice). A compiled backward is one program that frees
its saved inputs only when it returns, so these bytes are live at a compiled step's peak (issue 25/31: GPT-2
124M saved 0.89 -> 0.59 GB). The loss and gradients stay within bfloat16 autocast's distance of CPU's."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu.compile_cache import keys


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=32,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).train()


def _step(partitioner: str | None, monkeypatch: pytest.MonkeyPatch) -> tuple[int, float, list[torch.Tensor]]:
    """A compiled training step's bytes saved for the backward, its loss and gradients."""
    if partitioner is None:
        monkeypatch.delenv("HF_TPU_PARTITIONER", raising=False)
    else:
        monkeypatch.setenv("HF_TPU_PARTITIONER", partitioner)
    torch._dynamo.reset()
    model = _gpt2().to("tpu")
    fn = torch.compile(model, backend="tpu", options={"serializable": False})
    ids = torch.arange(64).reshape(2, 32).to("tpu")
    saved: list[int] = []
    from hf_tpu import tensor

    params = {id(tensor.value(p)) for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # a parameter handed back for the backward is the parameter itself (graph_outputs.py): no new bytes
        if not (t.device.type == "tpu" and id(tensor.value(t)) in params):
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("tpu", dtype=torch.bfloat16):
        loss = fn(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(saved), loss.item(), [p.grad.cpu() for p in model.parameters()]


def test_compiled_forward_saves_fewer_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, loss, grads = _step(None, monkeypatch)
    before, _, _ = _step("default", monkeypatch)
    assert ours < 0.8 * before, (ours, before)  # 2-layer GPT-2: 1.10 MB, PyTorch's default partitioner 1.73 MB
    cpu = _gpt2()
    ids = torch.arange(64).reshape(2, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_loss = cpu(input_ids=ids, labels=ids).loss
    cpu_loss.backward()
    assert abs(loss - cpu_loss.item()) < 1e-2
    for g, p in zip(grads, cpu.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=5e-2, atol=5e-3)  # bfloat16 autocast on both sides


def test_partitioner_is_in_the_graph_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keys.versions.cache_clear()
    try:
        ours = keys.versions()["partitioner"]
        monkeypatch.setenv("HF_TPU_PARTITIONER", "default")
        keys.versions.cache_clear()
        assert keys.versions()["partitioner"] != ours  # a graph saved under one is not served under the other
    finally:
        monkeypatch.undo()
        keys.versions.cache_clear()


def test_forward_hands_back_the_parameters_it_saves(highest) -> None:  # noqa: ARG001 - float32 at IEEE
    # A float32 linear layer's backward needs its weight: the forward graph returns the weight (an input) for the
    # backward, and XLA copied it into an output buffer of its own in every step (graph_outputs.py); eager saves
    # the parameter itself. The saved tensor is now the parameter, and the step's numbers are CPU's.
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    model.load_state_dict(cpu.state_dict())
    model = model.to("tpu")
    x = torch.randn(32, 64)
    fn = torch.compile(model, backend="tpu", options={"serializable": False})
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x.to("tpu"))
    from hf_tpu import tensor

    # the second layer's weight is saved (the first one's is not needed: x takes no gradient)
    held = {id(tensor.value(t)) for t in saved if t.device.type == "tpu"}
    assert id(tensor.value(model[2].weight)) in held, "the saved weight is a copy, not the parameter"
    out.sum().backward()
    ref = cpu(x)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)


def test_autocast_weight_copies_are_recomputed_not_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bfloat16 autocast the min-cut partitioner saved each weight's bfloat16 copy for the backward's
    matmuls although the weight itself is alive anyway (GPT-2 124M: 0.24 GB at the compiled backward's peak);
    partition_fn recomputes those casts in the backward. No saved tensor is a weight's bfloat16 copy (or its
    transpose), while the plain min-cut partitioner saves them, and fewer bytes are saved."""
    weights = [p.detach().to(torch.bfloat16) for p in _gpt2().parameters() if p.dim() == 2]
    held: list[torch.Tensor] = []
    orig = torch.autograd.graph.saved_tensors_hooks

    def spy(pack, unpack):  # what _step's hook sees, kept
        def pack2(t: torch.Tensor) -> torch.Tensor:
            if t.dtype == torch.bfloat16 and t.dim() == 2:
                held.append(t.detach().cpu())
            return pack(t)
        return orig(pack2, unpack)

    def copies() -> int:
        return sum(any(t.shape == w.shape and torch.equal(t, w) or t.shape == w.T.shape and torch.equal(t, w.T)
                       for w in weights) for t in held)

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", spy)
    ours, _, _ = _step(None, monkeypatch)
    assert copies() == 0
    held.clear()
    plain, _, _ = _step("min_cut", monkeypatch)
    assert copies() > 0
    assert ours < plain, (ours, plain)
