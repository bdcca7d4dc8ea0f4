"""hf_tpu.hooks, the door through which the harness and tests change a running device: each hook does what it
says inside its block and leaves nothing behind it."""

import pytest
import torch

import hf_tpu  # noqa: F401  (registers tpu)
from hf_tpu import fused, hooks, precision


def test_observe_ops_sees_each_op_and_its_error():
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    seen, failed = [], []

    def record(dispatch, op, args, kwargs):
        seen.append(str(op))
        try:
            return dispatch(op, args, kwargs)
        except Exception as exc:
            failed.append((str(op), type(exc).__name__))
            raise

    with hooks.observe_ops(record):
        y = (x * 2).sum(dim=1)
        with pytest.raises(RuntimeError):
            torch.mm(x, x)  # (2, 3) @ (2, 3): shapes do not match
    assert any("mul" in s for s in seen) and any("sum" in s for s in seen), seen
    assert failed and "mm" in failed[0][0], failed
    with precision.cpu_reference():
        expect = (torch.arange(6.0).reshape(2, 3) * 2).sum(dim=1)
    assert torch.equal(y.cpu(), expect)
    n = len(seen)
    (x + 1).cpu()
    assert len(seen) == n  # the observer is gone after the block


def test_override_lowerings_changes_results_inside_only():
    a = torch.tensor([1.0, 2.0, 3.0])
    x = a.to("tpu")
    before = torch.exp(x).cpu()  # a plan for exp on this shape now exists

    def triple(op, fn):
        if "exp" not in str(op):
            return None
        return lambda *args, **kwargs: fn(*args, **kwargs) * 3

    with hooks.override_lowerings(triple):
        inside = torch.exp(x).cpu()
        other = (x + 1).cpu()
    after = torch.exp(x).cpu()
    with precision.cpu_reference():
        expect = torch.exp(a)
    torch.testing.assert_close(before, expect)
    torch.testing.assert_close(inside, expect * 3)  # the plan made before the block is not used inside it
    torch.testing.assert_close(other, a + 1)  # other ops keep their lowering
    torch.testing.assert_close(after, expect)  # nor the plan made inside it after


def test_launch_blocking_switches_and_restores():
    start = (fused.LAUNCH_BLOCKING, fused.ACTIVE)
    with hf_tpu.defer_and_fuse(True):
        inside = (fused.LAUNCH_BLOCKING, fused.ACTIVE)
        with hooks.launch_blocking(True):
            assert fused.LAUNCH_BLOCKING and not fused.ACTIVE  # blocking turns fusing off
            y = (torch.ones(3, device="tpu") * 2).cpu()
        assert (fused.LAUNCH_BLOCKING, fused.ACTIVE) == inside
    assert (fused.LAUNCH_BLOCKING, fused.ACTIVE) == start
    assert torch.equal(y, torch.full((3,), 2.0))


def test_observe_graphs_sees_a_compiled_graph():
    graphs = []

    def watch(compile_graph, gm, example_inputs):
        graphs.append(gm)
        return compile_graph(gm, example_inputs)

    def f(x):
        return torch.sin(x) + 1

    x = torch.linspace(0, 1, 5)
    with hooks.observe_graphs(watch):
        out = torch.compile(f, backend="tpu")(x.to("tpu")).cpu()
    assert graphs and any("sin" in str(n.target) for g in graphs for n in g.graph.nodes)
    with precision.cpu_reference():
        torch.testing.assert_close(out, f(x))
