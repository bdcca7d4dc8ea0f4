"""The graph cache steps aside while a torch-function mode is active (torch.set_default_device leaves a
DeviceContext on the stack, even set back to cpu): the mode is neither in the cache key nor in the saved
guards, and an ahead-of-time compile under it gave GPT-2's static-cache decode step a graph for other cache
shapes (Transformers' test_generate_with_static_cache after test_can_load_with_global_device_set)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import hf_tpu  # noqa: F401
from hf_tpu.compile_cache import store


@pytest.fixture
def cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_TPU_COMPILE_CACHE", "1")
    monkeypatch.setenv("HF_TPU_GRAPH_CACHE_DIR", str(tmp_path / "graphs"))
    monkeypatch.delenv("HF_TPU_SHARED_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    store.reset_stats()
    yield
    torch._dynamo.reset()


def _lookups() -> int:
    s = store.stats()
    return sum(s[t]["hits"] + s[t]["misses"] for t in ("memory", "host") if isinstance(s.get(t), dict))


def _f(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ x.T) + 1


def test_cache_serves_calls_without_a_mode(cache_on: None) -> None:
    x = torch.randn(8, 8)
    got = torch.compile(_f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), _f(x), rtol=2e-2, atol=2e-2)
    assert _lookups() > 0  # the cache was consulted: the test below measures something


def test_cache_is_bypassed_under_a_torch_function_mode(cache_on: None) -> None:
    x = torch.randn(8, 8)
    torch.set_default_device(torch.device("tpu", 0))
    torch.set_default_device(torch.device("cpu"))  # a DeviceContext(cpu) stays active
    try:
        assert torch._C._is_torch_function_mode_enabled()
        got = torch.compile(_f, backend="tpu")(x.to("tpu"))
    finally:
        torch.set_default_device(None)
    torch.testing.assert_close(got.cpu(), _f(x), rtol=2e-2, atol=2e-2)
    assert _lookups() == 0
