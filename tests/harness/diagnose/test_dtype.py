"""`hf-tpu diagnose --dtype`: read through the sweep's own dtype table (harness/core/model_dtype.py)."""

from __future__ import annotations

import pytest
import torch

from harness.diagnose.core import _dtype


def test_same_names_same_dtypes_as_the_sweep():
    assert _dtype("float32") is torch.float32 and _dtype("bfloat16") is torch.bfloat16


def test_float8_storage_refused_with_the_fix():
    with pytest.raises(ValueError, match="--dtype bfloat16"):
        _dtype("float8_e4m3fn")


def test_unknown_name_gets_the_sweeps_error():
    with pytest.raises(ValueError, match="unknown model dtype 'int8'"):
        _dtype("int8")
