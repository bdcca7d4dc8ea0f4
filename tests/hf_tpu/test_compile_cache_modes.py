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


class _FixedDraws(torch.overrides.TorchFunctionMode):
    """A draws-only mode (the sweep's shared_draws in miniature): torch.randn gives ones."""

    hf_tpu_draws_only = True

    def __init__(self) -> None:
        super().__init__()
        self.served = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.randn:
            self.served += 1
            return _ones_like_draw(args, kwargs)
        return func(*args, **kwargs)


@torch._dynamo.disable
def _ones_like_draw(args, kwargs):
    shape = args[0] if len(args) == 1 and isinstance(args[0], tuple | list | torch.Size) else args
    return torch.ones(tuple(shape), device=kwargs.get("device"), dtype=kwargs.get("dtype"))


def _noisy(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ x.T) + torch.randn(x.shape, device=x.device)


def _counts() -> tuple[int, int]:
    s = store.stats()
    return s["saved"], s["unsaveable"]


def test_cache_serves_a_graph_without_draws_under_a_draws_only_mode(cache_on: None) -> None:
    x = torch.randn(8, 8)
    with _FixedDraws():
        got = torch.compile(_f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), _f(x), rtol=2e-2, atol=2e-2)
    assert _lookups() > 0 and _counts() == (1, 0)
    # a new process's view: the memory tier emptied, the entry on the host found and used under the mode
    torch._dynamo.reset()
    store.reset_stats()
    with _FixedDraws():
        again = torch.compile(_f, backend="tpu")(x.to("tpu"))
    assert store.stats()["host"]["hits"] == 1
    torch.testing.assert_close(again.cpu(), got.cpu(), rtol=0, atol=0)
    # without the mode it is another key: the entry saved under the mode serves no unmoded call
    torch._dynamo.reset()
    store.reset_stats()
    torch.compile(_f, backend="tpu")(x.to("tpu"))
    assert store.stats()["host"] == {"hits": 0, "misses": 1}


def test_graph_that_draws_takes_the_ordinary_path_and_the_mode_serves_its_draws(cache_on: None) -> None:
    x = torch.randn(8, 8)
    with _FixedDraws() as mode:
        got = torch.compile(_noisy, backend="tpu")(x.to("tpu"))
    assert mode.served == 1  # the draw came from the mode, not from the backend's generator in a graph
    torch.testing.assert_close(got.cpu(), torch.nn.functional.gelu(x @ x.T) + 1, rtol=2e-2, atol=2e-2)
    assert _counts() == (0, 1)  # refused by the cache: nothing saved for it


class _PassThrough(torch.overrides.TorchFunctionMode):
    """A mode that does not declare itself draws-only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_cache_steps_aside_when_a_draws_only_mode_is_with_another_mode(cache_on: None) -> None:
    x = torch.randn(8, 8)
    with _PassThrough(), _FixedDraws():
        got = torch.compile(_f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), _f(x), rtol=2e-2, atol=2e-2)
    assert _lookups() == 0
