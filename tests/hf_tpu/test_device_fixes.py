"""Regression tests for device bugs found while integrating Hugging Face models (issue 3)."""

import torch


def test_zero_inplace_on_tensor_and_view():
    # aten::zero_ had no lowering; PyTorch's decomposition (zeros_like -> zero_) recursed forever.
    # BERT's and T5's weight init and masks hit it.
    x = torch.arange(6, dtype=torch.float32).to("tpu")
    x[2:].zero_()
    assert x.cpu().tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    i = torch.ones(3, dtype=torch.int64, device="tpu").zero_()
    assert i.dtype == torch.int64 and i.cpu().tolist() == [0, 0, 0]
    assert torch.zeros_like(torch.ones(2, 2, device="tpu")).cpu().sum().item() == 0
