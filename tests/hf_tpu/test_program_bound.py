"""The bound on live XLA executables (program_bound.py): an eager program meeting many distinct shapes keeps
its memory mappings under the bound, instead of growing until vm.max_map_count kills the process (the
OpInfo parity run died so at ~3,000 pairs), and its results stay right across a release."""

from __future__ import annotations

import pytest
import torch

from hf_tpu import program_bound


@pytest.fixture
def low_bound(monkeypatch):
    """A bound 100 mappings above today's count, looked at every 4 executables."""
    torch.ones(1, device="tpu").add(1).cpu()  # JAX started, its listeners installed
    start = program_bound.map_count()
    if start == 0:
        pytest.skip("no /proc/self/maps")
    monkeypatch.setattr(program_bound, "CHECK_EVERY", 4)
    monkeypatch.setattr(program_bound, "FRACTION", 0.5)
    program_bound.set_limit(2 * (start + 100))
    yield start
    program_bound.set_limit(None)


def test_distinct_shapes_stay_under_the_bound(low_bound) -> None:
    start = low_bound
    releases = program_bound.stats()["releases"]
    peak = start
    for n in range(101, 221):  # 120 shapes never seen before: 120 new executables, 3-6 mappings each
        x = torch.arange(n, dtype=torch.float32)
        got = (x.to("tpu") * 3).cpu()
        torch.testing.assert_close(got, x * 3, rtol=0, atol=0)
        peak = max(peak, program_bound.map_count())
    assert program_bound.stats()["releases"] > releases, "no release although the bound was crossed"
    # the bound (start + 100) plus what at most CHECK_EVERY executables between two looks can add
    assert peak - start < 100 + 4 * 20, f"mappings grew by {peak - start}"


def test_no_release_below_the_bound() -> None:
    before = program_bound.stats()["releases"]
    torch.ones(3, device="tpu").mul(2).cpu()
    program_bound.set_limit(None)
    from hf_tpu import runtime

    if program_bound.map_count() < program_bound.FRACTION * program_bound.map_limit():
        assert program_bound.check(runtime.jax()) is False
        assert program_bound.stats()["releases"] == before
