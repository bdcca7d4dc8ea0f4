from collections.abc import Iterator

import pytest
import torch

import hf_tpu


@pytest.fixture(autouse=True)
def _backends_flags_settable() -> None:
    """PyTorch's test utilities (torch.testing._internal.common_utils, imported for OpInfo and the autocast
    test lists) forbid setting torch.backends flags for the rest of the process when imported; tests here set
    them (test_precision.py), whichever test imported the utilities first."""
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True


@pytest.fixture
def precision() -> Iterator[object]:
    """Set the tpu matmul precision for one test and restore it afterwards."""
    from hf_tpu import precision as p

    before_explicit, before_torch = p._explicit, torch.get_float32_matmul_precision()

    def set_(value: str) -> None:
        hf_tpu.set_matmul_precision(value)

    yield set_
    p._explicit = before_explicit
    p._orig_set(before_torch)


@pytest.fixture
def highest(precision) -> None:
    precision("highest")
