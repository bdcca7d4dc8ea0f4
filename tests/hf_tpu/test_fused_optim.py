"""Fused optimizers on tpu (hf_tpu/optim_lowerings.py): AdamW/Adam/SGD(fused=True), capturable too, equal to
`foreach` on CPU within float32 rounding; programs per chunk of same-shaped parameters, shared by models of the
same shapes and bit-identical to one program over all of them, and no new program when a schedule changes the
learning rate; a compiled fused step; GradScaler with a fused optimizer
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


def _programs() -> list:
    # each step's programs, with its parameters and states donated or not (optim_lowerings._donatable)
    fn = optim_lowerings._INPLACE[torch.ops.aten._fused_adamw_.default][0]
    statics = (("amsgrad", False), ("maximize", False))
    return [optim_lowerings._program(fn, statics, donate, (0, 2, 3, 4)) for donate in ((), (0, 2, 3, 4))]


def _compiled_programs() -> int:
    return sum(f._cache_size() for f in _programs())


def _step(n_layers: int, lrs: list[float]) -> tuple[list[str], int]:
    """The ops a step dispatches, and the programs compiled by the steps after the first."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(n_layers)]).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], fused=True)
    model(torch.randn(2, 4, device="tpu")).sum().backward()
    opt.step()  # warm-up: the programs are compiled here
    sizes = _compiled_programs()
    seen = _Ops()
    for lr in lrs[1:]:
        for g in opt.param_groups:
            g["lr"] = lr
        with _Ops() as seen:
            opt.step()
    return seen.ops, _compiled_programs() - sizes


def test_programs_by_shape_shared_across_models_and_lr_traced() -> None:
    """One `_fused_adamw_` call per step; its programs depend on the parameters' shapes (chunks of 2**k
    same-shaped parameters), so a second model of the same shapes compiles nothing, whatever its number of
    parameters, and neither does a new learning rate."""
    big, new_big = _step(12, [1e-2, 5e-3, 1e-3])  # 12 weights and 12 biases: chunks of 8 and 4 of each
    assert sum("_fused_adamw_" in op for op in big) == 1, big  # every parameter in one call
    assert new_big == 0  # a new learning rate is an argument, not a new program
    before = _compiled_programs()
    small, new_small = _step(4, [1e-2, 5e-3])  # chunks of 4: the 12-layer model's programs
    assert small == big and new_small == 0
    assert _compiled_programs() == before
    _step(3, [1e-2])  # 3 = 2 + 1: new chunk sizes, new programs (the count is not blind)
    assert _compiled_programs() > before


def test_chunks_group_by_shape_in_powers_of_two() -> None:
    import numpy as np

    a, b = np.zeros((4, 4), np.float32), np.zeros(4, np.float32)
    params = [a, b, a, b, a, b, a, a, a]  # 6 of shape (4, 4), 3 of (4,)
    got = optim_lowerings.chunks([params, params, [], [np.zeros((), np.float32)] * 9])
    assert got == [[0, 2, 4, 6], [7, 8], [1, 3], [5]]
    # the same shape in another dtype is another group
    assert optim_lowerings.chunks([[a, a.astype(np.float64)]]) == [[0], [1]]


def _mixed_model() -> nn.Module:
    # repeated shapes (chunks of 2 and 1), and a weight of >= xla_options.LARGE_ELEMENTS elements, whose chunk
    # is compiled with XLA's full optimisation while the small ones keep the fast-compile flags
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 300), nn.Tanh(), nn.Linear(300, 256), nn.Tanh(), nn.Linear(256, 8),
                         nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _train_mixed(dev: str, kwargs: dict, fused: bool = True, steps: int = 3) -> dict[str, torch.Tensor]:
    model = _mixed_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), **kwargs, fused=fused, foreach=None if fused else False)
    torch.manual_seed(1)
    for _ in range(steps):
        # the same gradients on both devices (not a backward's, whose rounding differs by device and which
        # Adam's normalisation amplifies where a gradient is near zero): the step alone is compared
        for p in model.parameters():
            p.grad = torch.randn(p.shape).to(dev)
        opt.step()
        opt.zero_grad()
    state = {f"param.{k}": v.detach().cpu() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        state |= {f"state{i}.{k}": v.detach().cpu() for k, v in s.items() if isinstance(v, torch.Tensor)}
    return state


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2, weight_decay=0.1), dict(lr=1e-2, amsgrad=True, capturable=True)],
                         ids=["adamw", "amsgrad_capturable"])
def test_chunked_step_bit_identical_to_one_program(kwargs: dict, highest, monkeypatch) -> None:
    """The chunked step equals the whole parameter list in one program (the kernel before chunks) bit for bit,
    parameters and states, and CPU's fused AdamW within float32 rounding. The large weight makes the whole
    step take XLA's full optimisation; its small chunks must too (compiled with the fast-compile flags, as
    their own size would select, 1 ulp differs in a few hundred elements after one step)."""
    got = _train_mixed("tpu", kwargs)
    # the kernel before chunks: all parameters in one program, compiled as xla_options.jit decides for them
    monkeypatch.setattr(optim_lowerings, "chunks", lambda lists: [list(range(len(lists[0])))])
    monkeypatch.setattr(optim_lowerings, "variant", lambda program, lists: program)
    whole = _train_mixed("tpu", kwargs)
    assert got.keys() == whole.keys()
    for k, v in whole.items():
        assert torch.equal(got[k], v), k
    with cpu_reference():
        cpu = _train_mixed("cpu", {k: v for k, v in kwargs.items() if k != "capturable"})
    for k, v in cpu.items():
        torch.testing.assert_close(got[k].to(v.dtype), v, rtol=1e-5, atol=1e-6, msg=k)


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
