"""torch.histogram on tpu (hf_tpu/histogram.py) against CPU over every OpInfo sample: bin counts and bin edges
(bins as a count or as edges, range, weights, density, empty inputs)."""

from __future__ import annotations

import op_parity
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db


@pytest.mark.usefixtures("highest")
def test_every_opinfo_sample_matches_cpu() -> None:
    (op,) = [op for op in op_db if op.name == "histogram"]
    assert op_parity.check(op, torch.float32, samples=1000).forward == "pass"
