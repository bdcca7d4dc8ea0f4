import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutputWithPast

from harness.zoo import output_tensors


def test_flattens_model_outputs_tuples_and_dicts():
    out = BaseModelOutputWithPast(last_hidden_state=torch.ones(1, 2), hidden_states=(torch.zeros(1), torch.ones(1)))
    assert set(output_tensors(out)) == {"last_hidden_state", "hidden_states.0", "hidden_states.1"}
    nested = {"logits": torch.ones(2), "ids": torch.ones(2, dtype=torch.long), "none": None, "x": [torch.ones(1)]}
    assert set(output_tensors(nested)) == {"logits", "x.0"}
    assert set(output_tensors(torch.ones(3))) == {"output"}
    assert set(output_tensors((torch.ones(1), None, torch.ones(1)))) == {"0", "2"}


def test_images_and_complex():
    images = output_tensors({"images": np.zeros((1, 8, 8, 3), dtype=np.float32)})
    assert images["images"].shape == (1, 8, 8, 3)
    assert output_tensors(torch.ones(2, dtype=torch.complex64))["output"].shape == (2, 2)
