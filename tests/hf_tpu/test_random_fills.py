"""In-place random fills on tpu with `generator=` (issue 25): exponential_, log_normal_, cauchy_, geometric_,
random_(from, to) / random_(to) / random_(). Each must draw from the generator it is given (same seed, same
draws; get_state/set_state repeats them; the default generator is not touched), follow the distribution
(a goodness-of-fit test against the exact law at a fixed seed: tolerant, yet a wrong scale or shift fails
it by orders of magnitude), and keep CPU's dtype, value range and argument errors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

stats = pytest.importorskip("scipy.stats")

N = 20_000
Fill = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]

CONTINUOUS: dict[str, tuple[Fill, object]] = {
    "exponential_": (lambda t, g: t.exponential_(2.5, generator=g), stats.expon(scale=1 / 2.5)),
    "log_normal_": (lambda t, g: t.log_normal_(0.5, 0.7, generator=g), stats.lognorm(s=0.7, scale=np.exp(0.5))),
    "cauchy_": (lambda t, g: t.cauchy_(1.0, 2.0, generator=g), stats.cauchy(loc=1.0, scale=2.0)),
}
FILLS: dict[str, Fill] = {
    **{k: f for k, (f, _) in CONTINUOUS.items()},
    "geometric_": lambda t, g: t.geometric_(0.3, generator=g),
    "random_(from, to)": lambda t, g: t.random_(-3, 10, generator=g),
    "random_(to)": lambda t, g: t.random_(7, generator=g),
    "random_()": lambda t, g: t.random_(generator=g),
}


def _draw(fill: Fill, g: torch.Generator | None, dtype: torch.dtype = torch.float32, n: int = N) -> torch.Tensor:
    return fill(torch.empty(n, device="tpu", dtype=dtype), g).cpu()


@pytest.mark.parametrize("name", list(FILLS))
def test_generator_seed_and_state(name: str) -> None:
    fill = FILLS[name]
    g = torch.Generator("tpu").manual_seed(7)
    first = _draw(fill, g, n=256)
    g.manual_seed(7)
    assert torch.equal(_draw(fill, g, n=256), first)  # same seed, same draws
    state = g.get_state()
    after = _draw(fill, g, n=256)
    assert not torch.equal(after, first)  # the generator advanced
    g.set_state(state)
    assert torch.equal(_draw(fill, g, n=256), after)  # a state round trip repeats the draws
    other = torch.Generator("tpu").manual_seed(8)
    assert not torch.equal(_draw(fill, other, n=256), first)
    # drawing from a generator leaves the default tpu generator where it was
    default_state = torch.tpu.get_rng_state()
    _draw(fill, g, n=16)
    assert torch.equal(torch.tpu.get_rng_state(), default_state)


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_continuous_distribution(name: str) -> None:
    fill, law = CONTINUOUS[name]
    x = _draw(fill, torch.Generator("tpu").manual_seed(0)).double().numpy()
    assert stats.kstest(x, law.cdf).pvalue > 1e-4
    # the same statistic on CPU's draws (the oracle's own spread), so the threshold is not the only judge
    cpu = fill(torch.empty(N), torch.Generator().manual_seed(0)).double().numpy()
    assert stats.kstest(x, law.cdf).statistic < 3 * max(stats.kstest(cpu, law.cdf).statistic, 1 / np.sqrt(N))


def _chi2_pvalue(x: np.ndarray, support: np.ndarray, probs: np.ndarray) -> float:
    observed = np.array([(x == k).sum() for k in support], dtype=float)
    assert observed.sum() == len(x), "values outside the support"
    return float(stats.chisquare(observed, probs / probs.sum() * len(x)).pvalue)


def test_geometric_distribution() -> None:
    x = _draw(FILLS["geometric_"], torch.Generator("tpu").manual_seed(0)).numpy()
    assert x.min() >= 1 and np.all(x == np.round(x))
    top = 20  # the tail past `top` lumped into one cell
    clipped = np.minimum(x, top)
    support = np.arange(1, top + 1)
    probs = stats.geom(0.3).pmf(support)
    probs[-1] = stats.geom(0.3).sf(top - 1)
    assert _chi2_pvalue(clipped, support, probs) > 1e-4


@pytest.mark.parametrize(("name", "low", "high"), [("random_(from, to)", -3, 9), ("random_(to)", 0, 6)])
def test_random_bounded_uniform(name: str, low: int, high: int) -> None:
    x = _draw(FILLS[name], torch.Generator("tpu").manual_seed(0)).numpy()
    support = np.arange(low, high + 1)
    assert _chi2_pvalue(x, support, np.ones(len(support))) > 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_random_unbounded_range_and_dtype(dtype: torch.dtype) -> None:
    """random_() draws [0, 2**digits] for floating dtypes, [0, max] for integer ones, {0, 1} for bool, as
    CPU: the largest values drawn are near the top of that range (not a smaller or larger one)."""
    x = _draw(FILLS["random_()"], torch.Generator("tpu").manual_seed(0), dtype=dtype, n=4096)
    cpu = torch.empty(4096, dtype=dtype).random_(generator=torch.Generator().manual_seed(0))
    assert x.dtype == cpu.dtype == dtype
    xs, cs = x.double(), cpu.double()
    assert xs.min() >= 0 and xs.max() <= cs.max() * 1.01 + 1 and cs.max() <= xs.max() * 1.01 + 1
    assert torch.equal(xs, xs.round())
    if dtype == torch.bool:
        assert set(x.tolist()) == {False, True}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", ["exponential_", "log_normal_", "cauchy_", "geometric_", "random_(from, to)"])
def test_dtypes_kept(name: str, dtype: torch.dtype) -> None:
    x = _draw(FILLS[name], torch.Generator("tpu").manual_seed(1), dtype=dtype, n=512)
    assert x.dtype == dtype and torch.isfinite(x).all()


def test_int64_from_to_wide_range() -> None:
    """A range of 2**40 takes ATen's 64-bit draw: values fill the range rather than stopping at 2**32."""
    x = torch.empty(4096, dtype=torch.int64, device="tpu").random_(-(2**39), 2**39,
                                                                   generator=torch.Generator("tpu").manual_seed(0))
    x = x.cpu()
    assert x.min() >= -(2**39) and x.max() < 2**39 and x.max() > 2**38 and x.min() < -(2**38)


@pytest.mark.parametrize(("call", "match"), [
    (lambda t: t.exponential_(-1.0), "lambda > 0"),
    (lambda t: t.log_normal_(0.0, -1.0), "std > 0"),
    (lambda t: t.cauchy_(0.0, 0.0), "sigma > 0"),
    (lambda t: t.geometric_(1.5), "p to be in"),
    (lambda t: t.random_(5, 3), "from' to be less than 'to'"),
])
def test_argument_errors_as_cpu(call: Callable[[torch.Tensor], torch.Tensor], match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        call(torch.empty(4))
    with pytest.raises(RuntimeError, match=match):
        call(torch.empty(4, device="tpu")).cpu()


def test_cpu_generator_advances() -> None:
    """A CPU generator passed to a tpu fill is drawn from (and so advances), as for the other tpu random ops."""
    g = torch.Generator().manual_seed(3)
    a = torch.empty(64, device="tpu").exponential_(generator=g).cpu()
    b = torch.empty(64, device="tpu").exponential_(generator=g).cpu()
    g.manual_seed(3)
    assert torch.equal(torch.empty(64, device="tpu").exponential_(generator=g).cpu(), a) and not torch.equal(a, b)
