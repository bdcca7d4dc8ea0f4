"""cross_entropy.py: F.cross_entropy on tpu as one forward and one backward program, against CPU float32
(the numerics rule, with a float64 CPU reference), for every reduction and with ignored rows; the cases it
does not take (class weights, label smoothing, (N, C, d) inputs, bfloat16, probability targets) keep the
composite path and still match CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.sweep import numerics
from hf_tpu import cross_entropy
from hf_tpu.precision import cpu_reference

TOL = numerics.tolerance_for("cross_entropy", "highest", "float32")


def _check(name: str, cpu: torch.Tensor, tpu: torch.Tensor, fp64: torch.Tensor) -> None:
    ok, metrics, reason = numerics.compare_tensor(name, cpu, tpu.cpu(), fp64, TOL)
    assert ok, (reason, metrics)


def _run(x: torch.Tensor, target: torch.Tensor, device: str, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().to(device).requires_grad_()
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    loss = F.cross_entropy(leaf, target.to(device), **kw)
    grad_out = torch.linspace(0.5, 1.5, loss.numel(), dtype=x.dtype).reshape(loss.shape).to(device)
    loss.backward(grad_out)
    return loss.detach(), leaf.grad


def _compare(x: torch.Tensor, target: torch.Tensor, fused: bool, **kw: object) -> None:
    with cpu_reference():
        cpu_loss, cpu_grad = _run(x, target, "cpu", **kw)
        ref_loss, ref_grad = _run(x.double(), target, "cpu", **{k: (v.double() if isinstance(v, torch.Tensor) else v)
                                                                for k, v in kw.items()})
    leaf = x.detach().to("tpu").requires_grad_()
    on_tpu = {k: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    grad_fn = F.cross_entropy(leaf, target.to("tpu"), **on_tpu).grad_fn
    assert (type(grad_fn).__name__ == "_CrossEntropyBackward") == fused, grad_fn
    tpu_loss, tpu_grad = _run(x, target, "tpu", **kw)
    dt = cpu_loss.dtype
    _check("loss", cpu_loss, tpu_loss, ref_loss.to(torch.float64) if dt == torch.float32 else None)
    _check("grad", cpu_grad, tpu_grad, ref_grad if dt == torch.float32 else None)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignored", [False, True])
def test_fused_matches_cpu(reduction: str, ignored: bool) -> None:
    g = torch.Generator().manual_seed(0)
    n, c = 64, 5000  # wide rows: the sums over classes are where XLA's order differs from CPU's
    x = torch.randn(n, c, generator=g) * 4
    target = torch.randint(0, c, (n,), generator=g)
    if ignored:
        target[::3] = -100
    _compare(x, target, True, reduction=reduction)


def test_custom_ignore_index_and_all_ignored() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 33, generator=g)
    target = torch.randint(0, 33, (16,), generator=g)
    target[:5] = 7
    _compare(x, target, True, ignore_index=7)
    # every row ignored: "mean" is 0/0 = nan on CPU, and its gradient zero
    loss, grad = _run(x, torch.full((16,), -100), "tpu")
    assert loss.cpu().isnan() and not grad.cpu().any()


@pytest.mark.parametrize("case", ["weight", "label_smoothing", "3d", "bfloat16", "probabilities"])
def test_other_cases_keep_the_composite(case: str) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 11, generator=g)
    target = torch.randint(0, 11, (8,), generator=g)
    kw: dict[str, object] = {}
    if case == "weight":
        kw["weight"] = torch.rand(11, generator=g) + 0.5
    elif case == "label_smoothing":
        kw["label_smoothing"] = 0.1
    elif case == "3d":
        x, target = torch.randn(4, 11, 3, generator=g), torch.randint(0, 11, (4, 3), generator=g)
    elif case == "bfloat16":
        x = x.bfloat16()
    else:
        target = torch.softmax(torch.randn(8, 11, generator=g), dim=1)
    if case == "bfloat16":
        leaf = x.to("tpu").requires_grad_()
        assert type(F.cross_entropy(leaf, target.to("tpu")).grad_fn).__name__ != "_CrossEntropyBackward"
        return  # the composite path's own bfloat16 parity is the op-parity suite's
    _compare(x, target, False, **kw)


def test_one_program_each_way() -> None:
    """The forward and the backward each run one program: no log_softmax or nll_loss reaches dispatch (the
    composite path, taken with class weights, dispatches both: the check can see them)."""
    from hf_tpu import hooks

    x = torch.randn(32, 300).to("tpu").requires_grad_()
    target = torch.randint(0, 300, (32,)).to("tpu")

    def ops_of(**kw: object) -> list[str]:
        seen: list[str] = []

        def record(dispatch, op, args, kwargs):  # noqa: ANN001, ANN202
            seen.append(str(op))
            return dispatch(op, args, kwargs)

        with hooks.observe_ops(record):
            F.cross_entropy(x, target, **kw).backward()
        return [s for s in seen if "softmax" in s or "nll_loss" in s]

    assert ops_of() == []
    assert len(ops_of(weight=torch.ones(300).to("tpu"))) >= 4


def test_no_grad_and_eligibility() -> None:
    x = torch.randn(4, 9).to("tpu")
    t = torch.randint(0, 9, (4,)).to("tpu")
    with torch.no_grad():
        torch.testing.assert_close(F.cross_entropy(x, t).cpu(), F.cross_entropy(x.cpu(), t.cpu()))
    assert cross_entropy.eligible(x, t, None, 1, 0.0)
    assert not cross_entropy.eligible(x, t.int(), None, 1, 0.0)
    assert not cross_entropy.eligible(x.cpu(), t.cpu(), None, 1, 0.0)


def test_compiled_keeps_the_composite() -> None:
    """torch.compile traces cross_entropy with FakeTensors: the kernel hands it to the composite, and the
    compiled loss and gradient equal CPU's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 50)
    x, t = torch.randn(8, 16), torch.randint(0, 50, (8,))
    t[0] = -100

    def f(m: torch.nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), t)

    with cpu_reference():
        cpu_loss = f(lin, x, t)
        cpu_loss.backward()
    lin_t = torch.nn.Linear(16, 50)
    lin_t.load_state_dict(lin.state_dict())
    lin_t.to("tpu")
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        loss = torch.compile(f, backend="tpu")(lin_t, x.to("tpu"), t.to("tpu"))
        loss.backward()
    finally:
        torch.set_float32_matmul_precision(prev)
    assert type(loss.grad_fn).__name__ == "CompiledFunctionBackward"
    torch.testing.assert_close(loss.cpu(), cpu_loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lin_t.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-6)


def test_view_input_as_transformers_passes_it() -> None:
    """Transformers' loss: logits (B, T, V) in bfloat16 -> .float() -> .view(-1, V), labels shifted and
    viewed: the fused program reads the views from their buffers; loss and gradient equal CPU's."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 9, 40, generator=g) * 3).bfloat16()
    labels = F.pad(torch.randint(0, 40, (2, 9), generator=g), (0, 1), value=-100)[..., 1:].contiguous()

    def run(device: str) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = logits.to(device, copy=True).requires_grad_()
        loss = F.cross_entropy(leaf.float().view(-1, 40), labels.to(device).view(-1))
        loss.backward()
        return loss.detach().cpu(), leaf.grad.cpu()

    with cpu_reference():
        cpu_loss, cpu_grad = run("cpu")
    tpu_loss, tpu_grad = run("tpu")
    torch.testing.assert_close(tpu_loss, cpu_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tpu_grad, cpu_grad)  # bfloat16: equal to its rounding
