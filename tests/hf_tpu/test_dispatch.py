"""hf_tpu/dispatch.py's fast path: a repeated call reuses its plan and still agrees with CPU PyTorch."""

import pytest
import torch

from hf_tpu import dispatch, plans


def _twice(fn, *cpu_args):
    """fn on CPU, and twice on tpu (the second call takes the fast path): all three must agree."""
    want = fn(*cpu_args)
    dev = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    first, second = fn(*dev).cpu(), fn(*dev).cpu()
    for got in (first, second):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn, args", [
    (lambda a, b: a + b, (torch.randn(5), torch.randn(5))),
    (lambda a: a + 1, (torch.arange(5),)),  # int stays int
    (lambda a: a + 1.5, (torch.arange(5),)),  # int + float scalar -> float32
    (lambda a: a + True, (torch.arange(5),)),
    (lambda a: torch.sigmoid(a), (torch.arange(5),)),  # integer input promoted before the lowering
    (lambda a, b: a * b, (torch.randn(3, dtype=torch.float32), torch.tensor(2.0, dtype=torch.float64))),
    (lambda a, b: a * b, (torch.randn(3, dtype=torch.float16), torch.randn(3, dtype=torch.float32))),
    (lambda a: a.sum(dim=0, keepdim=True), (torch.randn(4, 3),)),
    # a view of integer/bool values promoted before the lowering (MM-Grounding-DINO's get_valid_ratio): the
    # promotion reads the view, so a plan must not feed the program the buffer
    (lambda m: torch.sum(m[:, 0, :], 1, dtype=torch.float32), (torch.ones(2, 1, 1, dtype=torch.bool),)),
    (lambda a: torch.sigmoid(a[:, 1:, 0]), (torch.arange(6).reshape(2, 3, 1),)),
])
def test_repeat_calls_match_cpu(fn, args):
    _twice(fn, *args)


def test_scalars_of_different_types_get_different_plans():
    x = torch.arange(4).to("tpu")
    assert (x + 1).dtype == torch.int64
    assert (x + 1.0).dtype == torch.float32  # 1.0 == 1 as a dict key: the type must be in the key
    assert (x + True).dtype == torch.int64
    assert (x + 1).dtype == torch.int64


def test_new_shapes_reuse_the_plan_and_stay_right():
    a = torch.randn(3, 4)
    for shape in ((3, 4), (7,), (2, 2, 2)):
        a = torch.randn(shape)
        torch.testing.assert_close((a.to("tpu") * 3).cpu(), a * 3)


def test_the_default_dtype_is_part_of_a_plan():
    before = torch.get_default_dtype()
    try:
        assert torch.arange(3.0, device="tpu").dtype == torch.float32
        torch.set_default_dtype(torch.float64)
        assert torch.arange(3.0, device="tpu").dtype == torch.float64
        assert (torch.ones(2, device="tpu") * 2).dtype == torch.float64
    finally:
        torch.set_default_dtype(before)


def test_nan_scalars_take_the_general_path_without_growing_the_plans():
    x = torch.randn(3).to("tpu")
    x + float("nan")
    n = len(plans.table)
    for _ in range(5):
        assert torch.isnan((x + float("nan")).cpu()).all()
    assert len(plans.table) == n


def test_a_plan_is_reused():
    a, b = torch.randn(6).to("tpu"), torch.randn(6).to("tpu")
    a - b
    key = plans.signature(torch.ops.aten.sub.Tensor, (a, b), {"alpha": 1})[0]
    plan = plans.table.get(key) or plans.table.get(plans.signature(torch.ops.aten.sub.Tensor, (a, b), {})[0])
    assert plan is not None
    calls = []
    real = plan.program
    plan.program = lambda *arrays: calls.append(1) or real(*arrays)
    try:
        torch.testing.assert_close((a - b).cpu(), a.cpu() - b.cpu())
    finally:
        plan.program = real
    assert calls == [1]


def test_errors_still_name_the_op():
    a, b = torch.randn(3).to("tpu"), torch.randn(4).to("tpu")
    torch.randn(3).to("tpu") + torch.randn(3).to("tpu")  # a plan for add exists
    with pytest.raises(RuntimeError):
        a + b


def test_a_lowering_replaced_at_run_time_is_honoured():
    from hf_tpu import hooks

    x = torch.randn(5).to("tpu")
    torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()))  # a plan for exp exists now

    def replace(op, fn):
        return (lambda *a, **k: fn(*a, **k) + 1) if op is torch.ops.aten.exp.default else None

    with hooks.override_lowerings(replace):
        torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()) + 1)
        torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()) + 1)  # its own plan
    # the real lowering again, and the plan made from it
    torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()))


def test_output_dtype_depends_on_which_keyword_is_set():
    # the output-dtype cache once keyed keyword values without their names: right=True then
    # out_int32=True (both one bool) gave int64 for the second
    seq, val = torch.tensor([1.0, 2.0, 3.0]).to("tpu"), torch.tensor([2.0]).to("tpu")
    assert torch.searchsorted(seq, val, right=True).dtype == torch.int64
    assert torch.searchsorted(seq, val, out_int32=True).dtype == torch.int32
