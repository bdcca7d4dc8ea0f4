"""Fused optimizers on tpu (hf_tpu/optim_lowerings.py): AdamW/Adam/SGD(fused=True), capturable too, equal to
`foreach` on CPU within float32 rounding, and to CPU's fused step; one XLA program per step (the step counts'
increment and view gradients inside it), none for zero_grad, and no new program when a schedule changes the
learning rate; a compiled fused step; GradScaler with a fused optimizer (grad_scale/found_inf) as on CPU
(issue 25)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

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


def _mixed_model() -> nn.Module:
    # repeated shapes and a weight of >= xla_options.LARGE_ELEMENTS elements (the step compiles with XLA's
    # full optimisation)
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 300), nn.Tanh(), nn.Linear(300, 256), nn.Tanh(), nn.Linear(256, 8),
                         nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _grad(shape: torch.Size, dev: str, view: bool) -> torch.Tensor:
    # on tpu, a view (every other element of a larger tensor) as backward ops give for some weights (ViT's,
    # convs'): the step reads it inside its own program. On CPU always contiguous: torch 2.13's CPU fused
    # AdamW reads a non-contiguous gradient wrongly (a (4, 3) slice of a (4, 3, 2): parameters 0.2 off
    # foreach's after one step at lr 0.1)
    g = torch.randn(*shape, 2)
    return g.to(dev)[..., 0] if view and dev == "tpu" else g[..., 0].contiguous().to(dev)


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    state = {f"param.{k}": v.detach().cpu() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        state |= {f"state{i}.{k}": v.detach().cpu() for k, v in s.items() if isinstance(v, torch.Tensor)}
    return state


def _train_mixed(dev: str, cls, kwargs: dict, mode: str = "fused", steps: int = 3) -> dict[str, torch.Tensor]:
    model = _mixed_model().to(dev)
    if isinstance(kwargs.get("lr"), torch.Tensor):
        kwargs = {**kwargs, "lr": kwargs["lr"].clone()}  # the scheduler writes it in place
    opt = cls(model.parameters(), **kwargs, **{mode: True})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    torch.manual_seed(1)
    for _ in range(steps):
        # the same gradients on both devices (not a backward's, whose rounding differs by device and which
        # Adam's normalisation amplifies where a gradient is near zero): the step alone is compared
        for i, p in enumerate(model.parameters()):
            p.grad = _grad(p.shape, dev, view=i % 3 == 0)
        opt.step()
        sched.step()
        opt.zero_grad()
    return _state(model, opt)


STEP_CASES = {**CASES,
              "adamw_tensor_lr": (torch.optim.AdamW, dict(lr=torch.tensor(1e-2), weight_decay=0.1)),
              "adamw_capturable_tensor_lr": (torch.optim.AdamW, dict(lr=torch.tensor(1e-2), capturable=True)),
              "adam_amsgrad_maximize": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, maximize=True,
                                                                weight_decay=0.05))}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_fused_step_equals_cpu_fused_and_foreach(case: str, highest) -> None:
    """Given the same gradients (a third of them views), three steps under a halving learning rate leave the
    parameters and every state (step counts included) as CPU's fused step and CPU's foreach step do."""
    cls, kwargs = STEP_CASES[case]
    got = _train_mixed("tpu", cls, kwargs)
    cpu_kwargs = {k: v for k, v in kwargs.items() if k != "capturable"}
    for mode in ("fused", "foreach"):
        if mode == "foreach" and isinstance(kwargs["lr"], torch.Tensor):  # CPU foreach takes a float only
            cpu_kwargs["lr"] = kwargs["lr"].item()
        with cpu_reference():
            ref = _train_mixed("cpu", cls, cpu_kwargs, mode)
        assert got.keys() == ref.keys()
        for k, v in ref.items():
            torch.testing.assert_close(got[k].to(v.dtype), v, rtol=1e-5, atol=1e-6, msg=f"{mode} {k}")


def _gpt2_sized_params() -> list[nn.Parameter]:
    """A 6-layer GPT-2's 76 parameters' shapes (narrowed): 2 embeddings, per layer 2 layer norms' 4 vectors
    and 4 Conv1D weights and biases, a final layer norm."""
    e, v, n = 16, 50, 20
    shapes = [(v, e), (n, e)]
    for _ in range(6):
        shapes += [(e,), (e,), (e, 3 * e), (3 * e,), (e, e), (e,), (e,), (e,), (e, 4 * e), (4 * e,), (4 * e, e), (e,)]
    shapes += [(e,), (e,)]
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(s).to("tpu")) for s in shapes]


def _programs_per_step(cls, kwargs: dict) -> tuple[int, int, int]:
    """XLA programs eager mode runs in a steady step (counters' eager_programs), in zero_grad() after it,
    and programs made by steps 3-5 (with a new learning rate each step)."""
    from hf_tpu import counters, executable_cache

    def programs_made() -> int:  # a new program signature is traced, or loaded from the executable cache
        return optim_lowerings.traces + executable_cache.stats()["hits"]

    params = _gpt2_sized_params()
    assert len(params) == 76
    if isinstance(kwargs.get("lr"), torch.Tensor):
        kwargs = {**kwargs, "lr": kwargs["lr"].clone()}  # written below
    opt = cls(params, **kwargs, fused=True)
    grads = [_grad(p.shape, "tpu", view=i % 4 == 0) for i, p in enumerate(params)]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    for _ in range(2):  # the first step makes the states; SGD's first step with momentum is a program of its own
        opt.step()
    made = programs_made()
    steps, zeros = [], []
    for k in range(3):
        for g in opt.param_groups:
            g["lr"] = 1e-3 / (k + 2) if not isinstance(g["lr"], torch.Tensor) else g["lr"].fill_(1e-3 / (k + 2))
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        before = counters.count("eager_programs")
        opt.step()
        steps.append(counters.count("eager_programs") - before)
        before = counters.count("eager_programs")
        opt.zero_grad()
        zeros.append(counters.count("eager_programs") - before)
    assert all(p.grad is None for p in params)
    assert torch.isfinite(params[0].detach().cpu()).all()
    return max(steps), max(zeros), programs_made() - made


@pytest.mark.parametrize("case", ["adamw", "adamw_capturable", "adamw_amsgrad", "adam_capturable_amsgrad",
                                  "adam_l2_maximize", "sgd", "sgd_momentum", "adamw_tensor_lr",
                                  "adamw_capturable_tensor_lr"])
def test_one_program_per_step(case: str) -> None:
    """A fused step of 76 parameters of mixed shapes (GPT-2's, with some gradients views) is one XLA
    program, the step counts' increment included, and zero_grad() adds none; a new learning rate each step
    makes no new program. Before: 93 programs per AdamW step (one per chunk of same-shaped parameters, one
    `add_` per step count)."""
    cls, kwargs = STEP_CASES[case]
    steps, zeros, made = _programs_per_step(cls, kwargs)
    assert (steps, zeros, made) == (1, 0, 0)


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
