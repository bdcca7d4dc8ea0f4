"""Op-level comparison in diagnose: what it must not trip on (found on the full-zoo sweep's real failures)."""

from __future__ import annotations

import torch

from harness.diagnose.ops import OpCall, compare, replay
from harness.sweep.numerics import tolerance_for

TOL = tolerance_for("test/op", "highest", "float32")


def test_conjugated_complex_outputs_compare() -> None:
    # Autoformer's FFT autocorrelation returns `x.conj()`: a lazily conjugated view, which view_as_real refuses
    x = torch.randn(8, dtype=torch.complex64)
    ref = x.conj()
    assert ref.is_conj()
    assert compare("out", ref, ref.resolve_conj().clone(), x.to(torch.complex128).conj(), TOL).match
    bad = compare("out", ref, ref.resolve_conj() * 1.5, None, TOL)
    assert not bad.match


def test_conj_op_replays_on_tpu() -> None:
    x = torch.randn(8, dtype=torch.complex64)
    r = replay(OpCall(1, torch.ops.aten.conj.default, (x,), {}, torch.ops.aten.conj.default(x)), "tpu", TOL)
    assert not r.error and r.match, r


def test_uninitialised_outputs_are_not_compared() -> None:
    # the CPU run's `empty` held garbage (1.4e14 in PP-DocLayoutV3): it was reported as the op that diverged
    garbage = torch.full((3, 2), 140737488355328, dtype=torch.int64)
    for op, args in ((torch.ops.aten.empty.memory_format, ([3, 2],)),
                     (torch.ops.aten.empty_like.default, (torch.zeros(3, 2, dtype=torch.int64),)),
                     (torch.ops.aten.empty_strided.default, ([3, 2], [2, 1]))):
        r = replay(OpCall(1, op, args, {"dtype": torch.int64}, garbage), "tpu", TOL)
        assert r.skipped == "uninitialised output" and not r.match
    # an op that computes is still compared
    z = replay(OpCall(2, torch.ops.aten.zeros.default, ([3, 2],), {"dtype": torch.int64}, garbage), "tpu", TOL)
    assert not z.skipped and not z.match


def test_compiled_graph_replay_gives_lowerings_mutable_lists() -> None:
    # a compiled graph node's list arguments are FX immutable_lists; torchax's convolution edits its padding
    # in place, so replaying PaliGemma's patch embedding raised "'immutable_list' object does not support
    # mutation" and diagnose reported that as the divergence
    from torch.fx.immutable_collections import immutable_list

    from harness.diagnose.compiled import _to_jax
    from hf_tpu import lowering
    from hf_tpu import precision as hp
    from hf_tpu import host_copy

    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 2, 2)
    args = (x, w, None, immutable_list([2, 2]), immutable_list([0, 0]), immutable_list([1, 1]), False,
            immutable_list([0, 0]), 1)
    jargs = _to_jax(args)
    assert all(type(a) is list for a in jargs if isinstance(a, list))
    with hp.forced("highest"):
        out = lowering.find(torch.ops.aten.convolution.default)(*jargs)
    ref = torch.ops.aten.convolution.default(*args)
    assert torch.allclose(host_copy.to_cpu(out, torch.float32), ref, atol=1e-5)
