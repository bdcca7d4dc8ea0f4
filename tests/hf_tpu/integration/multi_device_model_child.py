"""Run by test_multi_device_models.py in a process with HF_TPU_NUM_DEVICES=2: a tiny Llama loaded with
`device_map="auto"` and a memory budget per tpu device (and CPU offload), its logits and greedy tokens
against CPU's. Prints one JSON line."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from _hf_tiny import llama, rel_err, save_tiny

import hf_tpu
from hf_tpu.precision import cpu_reference


def main() -> dict:
    import transformers
    from accelerate.utils import compute_module_sizes

    hf_tpu.set_matmul_precision("highest")
    config = llama()
    config.num_hidden_layers = 4
    path = save_tiny("AutoModelForCausalLM", config, tempfile.mkdtemp())
    cls = transformers.AutoModelForCausalLM
    size = compute_module_sizes(cls.from_pretrained(path))[""]
    ids = torch.tensor([[1, 5, 9, 23, 7, 42], [1, 8, 3, 61, 17, 4]])
    with cpu_reference(), torch.no_grad():
        cpu = cls.from_pretrained(path).eval()
        ref_logits = cpu(ids).logits
        ref_tokens = cpu.generate(ids, max_new_tokens=8, do_sample=False)
    out: dict = {}
    budgets = {"two_devices": {0: int(size * 0.9), 1: int(size * 0.9), "cpu": 2 * size},
               "two_devices_and_cpu": {0: size // 3, 1: size // 3, "cpu": 2 * size}}
    for name, budget in budgets.items():
        model = cls.from_pretrained(path, device_map="auto", max_memory=budget).eval()
        with torch.no_grad():
            logits = model(ids.to(model.device)).logits
            tokens = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False)
        out[name] = {
            "map": sorted({str(v) for v in model.hf_device_map.values()}),
            "param_devices": sorted({str(p.device) for p in model.parameters()}),
            "logits_err": rel_err(ref_logits, logits),
            "tokens_equal": torch.equal(tokens.cpu(), ref_tokens),
        }
    return out


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main()) + "\n")
