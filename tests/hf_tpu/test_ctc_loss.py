"""F.ctc_loss on tpu against CPU (hf_tpu/ctc_loss.py): the loss and CPU's gradient with respect to log_probs,
for padded and concatenated targets, unequal input lengths, an empty target, an impossible alignment (infinite
loss, with and without zero_infinity), and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _case(kind: str) -> tuple:
    g = torch.Generator().manual_seed(0)
    t, n, c, s = 12, 4, 6, 5
    log_probs = torch.randn(t, n, c, generator=g).log_softmax(2)
    input_lengths = [12, 9, 12, 7]
    target_lengths = [5, 3, 0, 4]
    targets = torch.randint(1, c, (n, s), generator=g)
    if kind == "concatenated":
        targets = torch.cat([targets[b, :k] for b, k in enumerate(target_lengths)])
    if kind == "impossible":  # 6 labels, all equal, need 11 frames; 7 given: infinite loss
        targets = torch.full((n, 6), 2)
        target_lengths = [5, 3, 0, 6]
    return log_probs, targets, input_lengths, target_lengths


def _run(device: str, case: tuple, reduction: str, zero_infinity: bool, compiled: bool = False) -> tuple:
    log_probs, targets, input_lengths, target_lengths = case
    lp = log_probs.detach().to(device, copy=True).requires_grad_()

    def loss_fn(lp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(lp, targets, input_lengths, target_lengths, reduction=reduction, zero_infinity=zero_infinity)

    fn = torch.compile(loss_fn, backend="tpu") if compiled else loss_fn
    loss = fn(lp, targets.to(device))
    weights = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape).to(device)
    (loss * weights).sum().backward()
    return loss.detach().cpu(), lp.grad.cpu()


@pytest.mark.parametrize("kind,reduction,zero_infinity", [
    ("padded", "none", False), ("padded", "mean", False), ("concatenated", "sum", False),
    ("impossible", "none", True), ("impossible", "none", False),
])
def test_ctc_loss_matches_cpu(highest, kind: str, reduction: str, zero_infinity: bool) -> None:
    case = _case(kind)
    want_loss, want_grad = _run("cpu", case, reduction, zero_infinity)
    got_loss, got_grad = _run("tpu", case, reduction, zero_infinity)
    if kind == "impossible":
        assert torch.isinf(want_loss).any() != zero_infinity  # the case is the one meant
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_ctc_loss_matches_cpu_compiled(highest) -> None:
    torch._dynamo.reset()
    case = _case("padded")
    want = _run("cpu", case, "mean", False)
    got = _run("tpu", case, "mean", False, compiled=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
