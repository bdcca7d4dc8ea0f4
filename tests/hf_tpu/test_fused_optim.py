"""Fused optimizers on tpu (hf_tpu/optim_lowerings.py): AdamW/Adam/SGD(fused=True), capturable too, equal to
`foreach` on CPU within float32 rounding; one program per step whatever the number of parameters, and no new
program when a schedule changes the learning rate; a compiled fused step; GradScaler with a fused optimizer
(grad_scale/found_inf) as on CPU (issue 25)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import optim_lowerings
from hf_tpu.precision import cpu_reference

CASES = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    "adamw_capturable": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, capturable=True)),
    "adam_l2_maximize": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, maximize=True)),
    "adam_capturable_amsgrad": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, capturable=True)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _train(dev: str, cls, kwargs: dict, mode: str, steps: int = 3) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(_model()).to(dev)
    opt = cls(model.parameters(), **kwargs, **{mode: True})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a new lr every step
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 6).to(dev)
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    state = {f"param.{k}": v.detach().cpu() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        state |= {f"state{i}.{k}": v.detach().cpu() for k, v in s.items() if isinstance(v, torch.Tensor)}
    return state


@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_foreach_on_cpu(case: str, highest) -> None:
    cls, kwargs = CASES[case]
    # capturable (step counts kept on the device) is CUDA's/tpu's: CPU's reference runs the same math without it
    with cpu_reference():
        ref = _train("cpu", cls, {k: v for k, v in kwargs.items() if k != "capturable"}, "foreach")
    got = _train("tpu", cls, kwargs, "fused")
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(got[k].to(v.dtype), v, rtol=1e-5, atol=1e-6, msg=k)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _step_ops(n_layers: int, lrs: list[float]) -> tuple[list[str], int]:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(n_layers)]).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], fused=True)
    model(torch.randn(2, 4, device="tpu")).sum().backward()
    opt.step()  # warm-up: the program is compiled here
    sizes = sum(f._cache_size() for f in _programs())
    for lr in lrs[1:]:
        for g in opt.param_groups:
            g["lr"] = lr
        with _Ops() as seen:
            opt.step()
    return seen.ops, sum(f._cache_size() for f in _programs()) - sizes


def _programs() -> list:
    # each step's program, with its parameters and states donated or not (optim_lowerings._donatable)
    return [optim_lowerings._program(*k, donate, (0, 2, 3, 4)) for k in _program_keys() for donate in ((), (0, 2, 3, 4))]


def _program_keys() -> list:
    # functools.cache keeps no public key list: the programs made so far are the ones for AdamW's statics
    fn = optim_lowerings._INPLACE[torch.ops.aten._fused_adamw_.default][0]
    return [(fn, (("amsgrad", False), ("maximize", False)))]


def test_one_program_per_step_and_lr_traced() -> None:
    small, new_small = _step_ops(1, [1e-2, 5e-3, 1e-3])
    big, new_big = _step_ops(12, [1e-2, 5e-3, 1e-3])
    fused = [op for op in big if "_fused_adamw_" in op]
    assert len(fused) == 1, big  # every parameter in one call, run as one program
    assert big == small  # the same ops whether 2 or 24 parameters
    assert new_small == 0 and new_big == 0  # a new learning rate is an argument, not a new program


def test_compiled_fused_step_matches_eager(highest) -> None:
    def run(compiled: bool) -> list[torch.Tensor]:
        model = copy.deepcopy(_model()).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
        step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
        torch.manual_seed(1)
        for _ in range(3):
            model(torch.randn(4, 6).to("tpu")).pow(2).mean().backward()
            step()
            opt.zero_grad()
        return [p.detach().cpu() for p in model.parameters()]

    for a, b in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_grad_scaler_with_fused_adamw_as_on_cpu(highest) -> None:
    """GradScaler hands the fused step its scale and found_inf: overflowing steps are skipped inside it."""
    def run(dev: str) -> tuple[list[float], list[torch.Tensor]]:
        model = copy.deepcopy(_model()).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 120, growth_interval=1)  # overflows at first
        scales = []
        torch.manual_seed(1)
        for _ in range(4):
            loss = model(torch.randn(4, 6).to(dev)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        return scales, [p.detach().cpu() for p in model.parameters()]

    with cpu_reference():
        cpu_scales, cpu_params = run("cpu")
    tpu_scales, tpu_params = run("tpu")
    assert tpu_scales == cpu_scales
    for a, b in zip(tpu_params, cpu_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _held_array(t: torch.Tensor):
    from hf_tpu import tensor as T

    return T.payload(t).buf.array


def test_step_donates_parameters_and_states_held_by_one_tensor(highest) -> None:
    """From the second step on, the step's program overwrites the old parameters and moments (donated to
    XLA) instead of holding old and new at once; the values are still foreach's on CPU."""
    model = copy.deepcopy(_model()).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for step in range(3):
        model(torch.randn(4, 6, device="tpu")).pow(2).mean().backward()
        p = next(model.parameters())
        old_param = _held_array(p)
        old_moment = _held_array(opt.state[p]["exp_avg"]) if step else None
        opt.step()
        opt.zero_grad()
        if step:
            assert old_param.is_deleted() and old_moment.is_deleted()
    assert not _held_array(p).is_deleted()
    assert torch.isfinite(p.detach().cpu()).all()


def test_step_keeps_an_array_another_tensor_shares(highest) -> None:
    """A tensor that took a parameter's value with `copy_` shares its array: the step must not donate it,
    and the copy keeps the value from before the step (as on CPU)."""
    for dev in ("cpu", "tpu"):
        model = copy.deepcopy(_model()).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=(dev == "tpu"), foreach=(dev == "cpu") or None)
        p = next(model.parameters())
        for _ in range(2):
            torch.manual_seed(3)
            model(torch.randn(4, 6).to(dev)).pow(2).mean().backward()
            before = torch.empty_like(p)
            before.copy_(p.detach())
            want = p.detach().cpu().clone()
            opt.step()
            opt.zero_grad()
            torch.testing.assert_close(before.cpu(), want, rtol=0, atol=0)
            assert not torch.equal(p.detach().cpu(), want)
