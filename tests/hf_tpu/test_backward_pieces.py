"""A compiled backward run in pieces (hf_tpu/backward_pieces.py): the activations the forward saved are let go
as the backward reaches them, not all held until its last gradient is written, and the gradients are the
whole program's, bit for bit. Both compilers of a training graph: the tpu backend's, and the graph cache's
saveable one (whose backward AOTAutograd wraps in torch._dynamo.disable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import backward_pieces, xla_options
from hf_tpu.compile_cache import serializable

LAYERS, BATCH, WIDTH = 8, 2048, 256
ACTIVATION = BATCH * WIDTH * 4  # one float32 activation of one layer


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())])


BACKENDS: dict[str, Any] = {"tpu": "tpu", "graph cache's": serializable.serializable_backend}


def _step(backend: Any, piece_bytes: int, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[list[int], list[int], list[torch.Tensor]]:
    """One compiled training step: bytes of live JAX arrays when each program of the forward, then of the
    backward, was called, and the gradients."""
    import jax

    monkeypatch.setenv("HF_TPU_BACKWARD_PIECE_BYTES", str(piece_bytes))
    calls: list[int] = []
    jit_full = xla_options.jit_full

    class Watched:
        def __init__(self, program: Any) -> None:
            self.program = program

        def __getattr__(self, name: str) -> Any:
            return getattr(self.program, name)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(sum(a.nbytes for a in jax.live_arrays()))
            return self.program(*args, **kwargs)

    def watched(*args: Any, **kwargs: Any) -> Any:
        return Watched(jit_full(*args, **kwargs))

    with monkeypatch.context() as patch:
        patch.setattr(xla_options, "jit_full", watched)
        torch._dynamo.reset()
        model = _mlp().to("tpu")
        x = torch.randn(BATCH, WIDTH).to("tpu")
        loss = torch.compile(model, backend=backend)(x).square().mean()
        forward = list(calls)
        calls.clear()
        loss.backward()
    return forward, calls, [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_lets_saved_activations_go_as_it_runs(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, backward, _ = _step(BACKENDS[backend], 2 * ACTIVATION, monkeypatch)
    assert len(backward) > 2, backward  # the backward ran as several programs
    # the last program runs without the activations of the layers already done: the forward saved at least
    # one per layer (compiled whole, the one program held them all: nothing fell)
    assert backward[0] - backward[-1] >= (LAYERS - 2) * ACTIVATION, backward


def test_pieces_give_the_whole_programs_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    _, whole_calls, whole = _step("tpu", 2**40, monkeypatch)
    _, piece_calls, pieces = _step("tpu", 2 * ACTIVATION, monkeypatch)
    assert len(whole_calls) == 1 and len(piece_calls) > 2
    for a, b in zip(whole, pieces, strict=True):
        assert torch.equal(a, b)


def test_plan_cuts_where_least_crosses() -> None:
    # a chain of layers: each cut falls between layers, where one activation's gradient crosses, and the
    # pieces release about equal shares of the saved bytes
    model = _mlp()
    fw_bw: dict[str, torch.fx.GraphModule] = {}

    def keep(name: str) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, _: Any) -> Any:
            fw_bw[name] = gm
            return gm

        return compiler

    from functorch.compile import make_boxed_compiler
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=make_boxed_compiler(keep("fw")), bw_compiler=make_boxed_compiler(keep("bw")))
    torch.compile(model, backend=backend)(torch.randn(BATCH, WIDTH)).sum().backward()
    bw = fw_bw["bw"]
    cuts = backward_pieces.plan(bw, min_piece_bytes=2 * ACTIVATION)
    assert 2 <= len(cuts) < LAYERS, cuts
    assert backward_pieces.plan(bw, min_piece_bytes=2**40) == []  # too little to free: compiled whole
    # between two layers only the gradient of the activation between them crosses (nothing, when that is a
    # dot's result)
    for c, crossing in _crossing(bw, cuts).items():
        assert [tuple(n.meta["val"].shape) for n in crossing] in ([], [(BATCH, WIDTH)]), (c, crossing)


def _crossing(bw: torch.fx.GraphModule, cuts: list[int]) -> dict[int, list[torch.fx.Node]]:
    """The values each cut writes out that one program need not: made before it, read after it, not dot
    results (which one program writes out too)."""
    order = backward_pieces._order(bw)
    place = {n: i for i, n in enumerate(order)}
    return {c: [n for n in order[:c + 1] if n.op == "call_function" and not backward_pieces._materialised(n)
                and any(place[u] > c and u.op != "output" for u in n.users)] for c in cuts}


def _capture_backward(model: torch.nn.Module, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """The backward graph AOTAutograd gives `model(*inputs).backward()` under bfloat16 autocast (CPU)."""
    from functorch.compile import make_boxed_compiler
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, _: Any) -> Any:
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=make_boxed_compiler(keep), bw_compiler=make_boxed_compiler(keep))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    loss.backward()
    return graphs[-1]


class _TiedLM(torch.nn.Module):
    """A language model's shape: a tied embedding, layers, the LM head and a cross-entropy over the vocabulary."""

    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width),
                                                                                torch.nn.Tanh())])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.layers(self.emb(ids)) @ self.emb.weight.t()
        return torch.nn.functional.cross_entropy(logits.float(), ids)


def test_cuts_materialise_only_the_residual_stream() -> None:
    # Under autocast the backward starts with the cross-entropy's elementwise chain on (tokens, vocab) values
    # feeding the LM head's gradient dots, and casts the head's weight gradient to float32 for the embedding's,
    # at its end. A cut inside that chain, or one the float32 copy crosses, writes out what one program fuses
    # away (GPT-2: +0.3 CPU-s per step). Every cut crosses only the gradient between two layers, or dot results.
    vocab, width, tokens, layers = 4096, 256, 512, 8
    torch.manual_seed(0)
    bw = _capture_backward(_TiedLM(vocab, width, layers), torch.randint(0, vocab, (tokens,)))
    total = sum(backward_pieces._bytes(n.meta["val"]) for n in bw.graph.nodes if n.op == "placeholder")
    cuts = backward_pieces.plan(bw, min_piece_bytes=total // 8)
    assert len(cuts) >= 2, cuts
    for c, crossing in _crossing(bw, cuts).items():
        assert [tuple(n.meta["val"].shape) for n in crossing] in ([], [(tokens, width)]), (c, crossing)
