"""The model both packed-weight test files run (test_packed_weights.py: compiled graphs; test_packed_eager.py:
Strict eager): one of each weight form packing meets, on CPU and its copy on tpu."""

from __future__ import annotations

import torch

import hf_tpu  # noqa: F401 - registers the tpu device


class Model(torch.nn.Module):
    """A tied embedding and LM head (the head's weight is read by the gather too: never packed), two nn.Linear
    weights (read as weight.t(); `addmm` with a bias, `mm` without), and a Conv1D-style weight (in x out,
    torch.addmm)."""

    def __init__(self, vocab: int = 300, d: int = 256, ff: int = 512) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.up = torch.nn.Linear(d, ff)
        self.down = torch.nn.Linear(ff, d, bias=False)
        self.conv_w = torch.nn.Parameter(torch.randn(d, d) * 0.05)
        self.conv_b = torch.nn.Parameter(torch.randn(d) * 0.05)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        h = torch.addmm(self.conv_b, h.view(-1, h.shape[-1]), self.conv_w).view(h.shape)
        return self.head(torch.tanh(h))


def pair() -> tuple[Model, Model, torch.Tensor]:
    """(the model on CPU, the same weights on tpu, token ids), seeded."""
    torch.manual_seed(0)
    cpu = Model().eval()
    tpu = Model().eval()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu"), torch.randint(0, 300, (2, 32))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """got (tpu) within float32's error of want (CPU), relative to want's scale."""
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
