"""torch.optim's foreach ops on tpu (hf_tpu/foreach_ops.py): one program per call with the scalars traced,
CPU's values; foreach AdamW/Adam/SGD and clip_grad_norm_ as on CPU, in a few programs per step whatever the
number of parameters, and no new program per step (before: a loop of single-tensor ops, 541 programs per
AdamW step of a 6-layer GPT-2, and 16 programs compiled every step for the step's new bias corrections)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hf_tpu  # noqa: F401  (registers `tpu`)
from hf_tpu import counters, executable_cache, foreach_ops, op_jit
from hf_tpu.precision import cpu_reference

SHAPES = [(3,), (2, 4), (), (5, 1)]


def _programs_made() -> int:
    """Programs traced by eager mode, or loaded from the executable cache (a new signature either way)."""
    return op_jit.traces + executable_cache.stats()["hits"] + executable_cache.stats()["misses"]


def _arg(arg: torch._C.Argument, k: int) -> object:
    torch.manual_seed(k)
    t = str(arg.type)
    if arg.name in ("alpha",):
        return 0.5
    if arg.name == "ord":
        return 2
    if arg.name == "dtype":
        return None
    if t.startswith("List[Tensor]"):
        return [torch.rand(s) + 0.5 for s in SHAPES]
    if t.startswith("List[number]") or "Scalar[]" in t or t == "List[Scalar]":
        return [0.25 + i / 7 for i in range(len(SHAPES))]
    if t.startswith("Tensor"):
        return torch.tensor(0.3)
    return 0.3 + k / 10  # a Scalar


def _call(op, dev: str, k: int):
    schema = op._schema.arguments
    args = [_arg(a, k + i) for i, a in enumerate(schema)]
    args = [[t.to(dev) for t in a] if isinstance(a, list) and isinstance(a[0], torch.Tensor)
            else a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
    out = op(*[a for a, s in zip(args, schema) if not s.kwarg_only],
             **{s.name: a for a, s in zip(args, schema) if s.kwarg_only})
    return [t.cpu() for t in (args[0] if out is None else out)]


@pytest.mark.parametrize("op", sorted(foreach_ops.OPS, key=str), ids=str)
def test_op_equals_cpu_in_one_program(op) -> None:
    """Each foreach op on 4 tensors: CPU's values, one program per call, and a call with new scalar values
    makes no new program."""
    with cpu_reference():
        want = _call(op, "cpu", 0)
    _call(op, "tpu", 0)  # compiles
    before, made = counters.count("eager_programs"), _programs_made()
    got = _call(op, "tpu", 0)
    assert counters.count("eager_programs") - before == 1
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=1e-7)
    with cpu_reference():
        want = _call(op, "cpu", 5)  # other scalars
    got = _call(op, "tpu", 5)
    assert _programs_made() == made
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=1e-7)


def test_half_precision_lists_keep_the_loop() -> None:
    """bfloat16 lists run PyTorch's loop (the single ops' own half-precision rounding), as before."""
    cpu = [torch.rand(s).to(torch.bfloat16) for s in SHAPES]
    tpu = [t.to("tpu") for t in cpu]
    torch._foreach_mul_(cpu, 0.3)
    before = counters.count("eager_programs")
    torch._foreach_mul_(tpu, 0.3)
    assert counters.count("eager_programs") - before == len(SHAPES)
    for a, b in zip(tpu, cpu, strict=True):
        # (tpu's mul_ by a scalar in bfloat16 is 1 ulp from CPU's in places: the single op's own rounding)
        torch.testing.assert_close(a.cpu(), b)


CASES = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True, maximize=True)),
    "adam_l2": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(8, 8), nn.LayerNorm(8))], nn.Linear(8, 3))


def _train(dev: str, cls, kwargs: dict, steps: int = 5, clip: bool = False) -> tuple[dict, list[int], int]:
    """Parameters and states after `steps` foreach steps (a halving learning rate, optionally gradient
    clipping), the programs each step ran, and the programs the last 3 steps made."""
    model = copy.deepcopy(_model()).to(dev)
    opt = cls(model.parameters(), **kwargs, foreach=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    torch.manual_seed(1)
    programs, made = [], 0
    for k in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape).to(dev)
        before, made_before = counters.count("eager_programs"), _programs_made()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
        opt.step()
        programs.append(counters.count("eager_programs") - before)
        if k >= steps - 3:
            made += _programs_made() - made_before
        sched.step()
        opt.zero_grad()
    state = {f"param.{k}": v.detach().cpu() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        state |= {f"state{i}.{k}": v.detach().cpu() for k, v in s.items() if isinstance(v, torch.Tensor)}
    return state, programs, made


@pytest.mark.parametrize("clip", [False, True], ids=["", "clip"])
@pytest.mark.parametrize("case", list(CASES))
def test_foreach_optimizer_as_on_cpu_in_few_programs(case: str, clip: bool, highest) -> None:
    """26 parameters: CPU's parameters and states after 5 steps; at most 12 programs per step (one per
    foreach call; it was one per parameter per call), 8 more for clip_grad_norm_'s total norm and scaling,
    and no program made by steps 3-5, whose learning rates and bias corrections are new."""
    cls, kwargs = CASES[case]
    with cpu_reference():
        ref, _, _ = _train("cpu", cls, kwargs, clip=clip)
    got, programs, made = _train("tpu", cls, kwargs, clip=clip)
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=k)
    assert max(programs[2:]) <= 12 + 8 * clip and made == 0, (programs, made)


def test_views_written_in_place_keep_the_loop() -> None:
    """Views among the tensors written in place (here two overlapping rows of one buffer) are written in
    turn, as CPU's loop does."""
    base_c = torch.arange(12.0).reshape(4, 3)
    base_t = base_c.to("tpu")
    torch._foreach_mul_([base_c[0:2], base_c[1:3]], 2.0)
    torch._foreach_mul_([base_t[0:2], base_t[1:3]], 2.0)
    torch.testing.assert_close(base_t.cpu(), base_c, rtol=0, atol=0)


def test_tensors_reshaped_from_their_buffer_written_in_one_program() -> None:
    """Gradients are often reshapes of a whole buffer (24 of a GPT-2's 76): written back in the buffer's
    shape by the call's own program, not reshaped by one program each (clip_grad_norm_'s scaling)."""
    from hf_tpu import tensor as T

    torch.manual_seed(0)
    cpu = [torch.randn(1, 6), torch.randn(2, 3), torch.randn(4)]
    tpu = [t.to("tpu").reshape(-1) for t in cpu]
    assert [T.payload(t).buf.shape != tuple(t.shape) for t in tpu] == [True, True, False]
    cpu = [t.reshape(-1) for t in cpu]
    coef_c, coef_t = torch.tensor(0.3), torch.tensor(0.3, device="tpu")
    torch._foreach_mul_(cpu, coef_c)
    torch._foreach_mul_(tpu, coef_t)  # compiles
    torch._foreach_mul_(cpu, coef_c)
    before = counters.count("eager_programs")
    torch._foreach_mul_(tpu, coef_t)
    assert counters.count("eager_programs") - before == 1
    for a, b in zip(tpu, cpu, strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_capturable_foreach_adamw_in_few_programs(amsgrad: bool, highest) -> None:
    """AdamW(foreach, capturable) computes its bias corrections from the step counts on tpu with
    `_foreach_pow(beta, steps)` and `_foreach_reciprocal_`: one program each (they looped: 243 programs per
    step for a 6-layer GPT-2, 18 now); the result is CPU's foreach AdamW's (which keeps its counts on CPU)
    within the float32 rounding of computing the corrections in tensors."""
    kwargs = dict(lr=1e-2, weight_decay=0.1, amsgrad=amsgrad)
    with cpu_reference():
        ref, _, _ = _train("cpu", torch.optim.AdamW, kwargs)
    got, programs, made = _train("tpu", torch.optim.AdamW, {**kwargs, "capturable": True})
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-5, msg=k)
    assert max(programs[2:]) <= 20 and made == 0, (programs, made)
