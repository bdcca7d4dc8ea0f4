"""The torchax 0.0.13 / torch 2.13 workaround loads torchax's table and leaves torch as it was."""

from __future__ import annotations

import torch
import torch._ops

from hf_tpu import torchax_compat


def test_loads_table_and_restores_torch() -> None:
    getattr_before = torch._ops.OpOverloadPacket.__getattr__
    rename_before = torch.utils.rename_privateuse1_backend
    lowerings, decomps = torchax_compat.load_op_table()
    assert torch.ops.aten.add.Tensor in lowerings or torch.ops.aten.add in lowerings
    assert len(lowerings) > 300 and len(decomps) > 100
    assert not any(isinstance(k, torchax_compat.MissingOverload) for k in lowerings)
    # torch is untouched: our device keeps its name, no torch.jax module, strict overload lookup
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert not hasattr(torch, "jax")
    assert torch._ops.OpOverloadPacket.__getattr__ is getattr_before
    assert torch.utils.rename_privateuse1_backend is rename_before
    try:
        _ = torch.ops.aten.prod.dim_Dimname
        raise AssertionError("torch 2.13 has no aten.prod.dim_Dimname; the tolerant lookup leaked")
    except AttributeError:
        pass


def test_tolerant_lookup_only_inside_context() -> None:
    with torchax_compat._tolerant_torch():
        missing = torch.ops.aten.prod.dim_Dimname
    assert isinstance(missing, torchax_compat.MissingOverload)
    assert "prod.dim_Dimname" in repr(missing)
