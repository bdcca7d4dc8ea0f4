"""Bad use gets a clear error; missing lowerings name the op; the opt-in CPU fallback records ops."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import hf_tpu
from hf_tpu import hooks, lowering


def test_device_index_out_of_range() -> None:
    with pytest.raises(RuntimeError, match=r"tpu:3 is not a valid device.*1 tpu device"):
        torch.ones(2, device="tpu:3")
    with pytest.raises(RuntimeError, match=r"tpu:3 is not a valid device"):
        torch.ones(2).to("tpu:3")


def test_mixed_devices() -> None:
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu"):
        torch.ones(3, device="tpu") + torch.ones(3)
    # a CPU scalar tensor is a scalar, as on CUDA
    assert (torch.ones(3, device="tpu") * torch.tensor(2.0)).cpu().tolist() == [2.0, 2.0, 2.0]


def test_unsupported_dtype() -> None:
    with pytest.raises(TypeError, match=r"tpu does not support dtype torch.uint16.*supported dtypes"):
        torch.zeros(2, dtype=torch.uint16).to("tpu")


@pytest.fixture
def missing_lowering(monkeypatch):
    """Pretend `aten.erfinv` has no lowering (as an op torchax lacks would)."""
    op = torch.ops.aten.erfinv.default
    monkeypatch.setattr(lowering, "decomposition", lambda o: None)
    with hooks.override_lowerings(lambda o, fn: hooks.NO_LOWERING if o is op else None):
        yield op


def test_missing_lowering_names_the_op(missing_lowering) -> None:
    with pytest.raises(NotImplementedError, match=r"no JAX lowering for aten::erfinv.default") as info:
        torch.erfinv(torch.rand(3, device="tpu"))
    assert info.value.op == "aten::erfinv.default"


def test_missing_lowering_in_a_compiled_graph_names_the_users_op(missing_lowering) -> None:
    """The graph compiler decomposes an op it cannot lower (erfinv -> prims.erf_inv); when the decomposition's
    op has no lowering either, the error names the user's op, the one to write a lowering for."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.erfinv(x * 0.5), backend="tpu")
    with pytest.raises(Exception, match=r"no JAX lowering for aten::erfinv.default") as info:
        f(torch.rand(3, device="tpu"))
    inner = getattr(info.value, "inner_exception", info.value)  # Dynamo shortens the message it wraps
    assert inner.op == "aten::erfinv.default" and "prims::erf_inv" in str(inner)
    torch._dynamo.reset()


def test_an_override_does_not_outlive_its_block() -> None:
    """Decompositions chosen while an op's lowering was overridden away (diagnose's fault injection) are
    forgotten with the override: the same graph compiles and matches CPU after it."""
    op = torch.ops.aten.erfinv.default
    x = torch.rand(3) * 0.5
    torch._dynamo.reset()
    with hooks.override_lowerings(lambda o, fn: hooks.NO_LOWERING if o is op else None):
        with pytest.raises(Exception, match="erfinv"):
            torch.compile(lambda t: torch.erfinv(t * 0.5), backend="tpu")(x.to("tpu"))
    torch._dynamo.reset()
    out = torch.compile(lambda t: torch.erfinv(t * 0.5), backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), torch.erfinv(x * 0.5))
    torch._dynamo.reset()


def test_cpu_fallback_runs_and_records(missing_lowering, monkeypatch) -> None:
    monkeypatch.setenv("HF_TPU_CPU_FALLBACK", "1")
    hf_tpu.reset_fallback_ops()
    x = torch.rand(3) * 0.5
    out = torch.erfinv(x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), torch.erfinv(x))
    torch.erfinv(x.to("tpu"))
    assert hf_tpu.fallback_ops() == {"aten::erfinv.default": 2}


def test_launch_blocking_raises_at_the_op() -> None:
    code = (
        "import torch\n"
        "x = torch.ones(3, device='tpu')\n"
        "try:\n"
        "    torch.ones(3, device='tpu') @ torch.ones(4, device='tpu')\n"
        "except RuntimeError as e:\n"
        "    print('raised', 'aten::' in str(e))\n"
    )
    for var in ("TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, var: "1"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert "raised True" in r.stdout


def _sparse_moved(x: torch.Tensor) -> torch.Tensor:
    return x.cpu().to_sparse_csr().to("tpu")


@pytest.mark.parametrize("make", [lambda x: x.to_sparse(), lambda x: x.to_sparse_csr(),
                                  lambda x: torch.view_as_complex(x[:, :2].half()),
                                  # a sparse CPU tensor moved to tpu: every op on it (it moves without one)
                                  lambda x: torch.sparse.mm(_sparse_moved(x), x.mT, "sum"),
                                  lambda x: torch.sparse.sampled_addmm(_sparse_moved(x @ x.mT), x, x.mT),
                                  lambda x: _sparse_moved(x).to_dense(),
                                  lambda x: x.cpu().to_sparse().to("tpu")],
                         ids=["to_sparse", "to_sparse_csr", "view_as_complex_float16", "sparse_mm_reduce",
                              "sparse_sampled_addmm", "moved_csr_to_dense", "moved_coo"])
def test_declared_unsupported_ops_name_op_and_alternative(make) -> None:
    """The ops docs/device.md declares unsupported raise errors.Unsupported naming the op, the reason and what
    to do instead, never a wrong dtype or a bare missing-lowering error."""
    from hf_tpu.errors import Unsupported

    with pytest.raises(Unsupported, match=r"aten::\w+\.\w+ is not supported on tpu: .+\. .+"):
        make(torch.randn(3, 4).to("tpu"))


def test_declared_unsupported_in_a_compiled_graph_too() -> None:
    """view_as_complex of float16 pairs raises the declared error through torch.compile as in eager (it was a
    bare TypeError from torchax's lowering); float32 pairs give CPU's complex64."""
    from hf_tpu.errors import Unsupported

    torch._dynamo.reset()
    x = torch.randn(3, 2)
    out = torch.compile(lambda t: torch.view_as_complex(t * 2), backend="tpu")(x.to("tpu"))
    assert out.dtype == torch.complex64 and torch.equal(out.cpu(), torch.view_as_complex(x * 2))
    torch._dynamo.reset()
    with pytest.raises(Unsupported, match=r"aten::view_as_complex.default is not supported on tpu"):
        torch.compile(lambda t: torch.view_as_complex(t * 2), backend="tpu")(x.half().to("tpu"))
    torch._dynamo.reset()
