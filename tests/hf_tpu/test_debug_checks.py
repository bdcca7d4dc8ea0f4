"""TORCH_TPU_ENABLE_DEBUG_CHECKS (issue 28, item 4): as in torch_tpu 0.2.0, indices computed from data are not
bounds-checked on tpu by default; with the variable set, each eager gather/scatter/indexing op raises what CPU
raises (same exception type, same message) for an index out of range, and accepts what CPU accepts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

from hf_tpu import debug_checks

X = torch.arange(10.0)
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "take": lambda x, i: torch.take(x, i),
    "index": lambda x, i: x[i],
    "index 2-D, second dim": lambda x, i: x.reshape(2, 5)[:, i],
    "index after a mask": lambda x, i: x.reshape(2, 5)[torch.tensor([True, False], device=x.device), i],
    "index_put_": lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0, device=x.device)),
    "index_put_ accumulate": lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0, device=x.device), True),
    "setitem": lambda x, i: (y := x.clone()).__setitem__(i, 5.0) or y,
    "index_select": lambda x, i: x.index_select(0, i),
    "gather": lambda x, i: x.gather(0, i),
    "scatter": lambda x, i: x.clone().scatter(0, i, torch.ones(len(i), device=x.device)),
    "scatter_ value": lambda x, i: x.clone().scatter_(0, i, 2.0),
    "scatter_add": lambda x, i: x.clone().scatter_add(0, i, torch.ones(len(i), device=x.device)),
    "scatter_reduce": lambda x, i: x.clone().scatter_reduce(0, i, torch.ones(len(i), device=x.device), "amax"),
    "index_add": lambda x, i: x.clone().index_add(0, i, torch.ones(len(i), device=x.device)),
    "index_copy": lambda x, i: x.clone().index_copy(0, i, torch.ones(len(i), device=x.device)),
    "index_fill": lambda x, i: x.clone().index_fill(0, i, 3.0),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x.reshape(10, 1)),
}
INDICES = [[3, 12], [-1], [-5], [-11], [10], [0, 4]]


def _outcome(fn: Callable[[], torch.Tensor]) -> tuple[str, str] | torch.Tensor:
    try:
        out = fn()
        return out.cpu() if isinstance(out, torch.Tensor) else out
    except (IndexError, RuntimeError) as exc:
        return type(exc).__name__, str(exc).splitlines()[0]


@pytest.fixture
def checks_on() -> Iterator[None]:
    before = debug_checks.enabled()
    debug_checks.set_enabled(True)
    yield
    debug_checks.set_enabled(before)


@pytest.mark.parametrize("index", INDICES, ids=[str(i) for i in INDICES])
@pytest.mark.parametrize("name", list(OPS))
def test_errors_and_results_as_cpu(checks_on: None, name: str, index: list[int]) -> None:
    op = OPS[name]
    if name in ("index 2-D, second dim", "index after a mask"):  # dimension 1 has size 5: halve, to land in and out of [-5, 5)
        index = [v // 2 for v in index]
    i = torch.tensor(index)
    want = _outcome(lambda: op(X, i))
    got = _outcome(lambda: op(X.to("tpu"), i.to("tpu")))
    if isinstance(want, tuple):
        assert got == want
    else:
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)


def test_index_tensor_on_cpu_checked_too(checks_on: None) -> None:
    with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 10"):
        X.to("tpu")[torch.tensor([12])].cpu()


def test_off_by_default_as_torch_tpu() -> None:
    """Without the variable an index out of range does not raise on tpu (torch_tpu 0.2.0 does not check
    either); the CPU transfer the check needs is not made."""
    assert os.environ.get(debug_checks.ENV) is None and not debug_checks.enabled()
    x = X.to("tpu")
    x[torch.tensor([3, 12], device="tpu")].cpu()  # no error
    torch.take(x, torch.tensor([12], device="tpu")).cpu()


def test_environment_variable_turns_checks_on() -> None:
    code = ("import torch\n"
            "try:\n"
            "    torch.take(torch.arange(4.0, device='tpu'), torch.tensor([7], device='tpu')).cpu()\n"
            "    print('no error')\n"
            "except IndexError as e:\n"
            "    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != debug_checks.ENV}
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                        env={**env, debug_checks.ENV: "1"})
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-2000:] + off.stderr[-2000:]
    assert on.stdout.strip() == "out of range: tried to access index 7 on a tensor of 4 elements."
    assert off.stdout.strip() == "no error"


def test_compiled_graphs_not_checked(checks_on: None) -> None:
    """torch_tpu checks eager ops only; a compiled graph keeps its speed."""
    f = torch.compile(lambda x, i: x[i] * 2, backend="tpu")
    f(X.to("tpu"), torch.tensor([1, 12], device="tpu")).cpu()  # no error
