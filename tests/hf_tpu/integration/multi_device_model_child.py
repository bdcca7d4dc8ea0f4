"""Run by test_multi_device_models.py in a process with HF_TPU_NUM_DEVICES=2: a tiny Llama loaded with
`device_map="auto"` and a memory budget per tpu device (and CPU offload), its logits and greedy tokens
against CPU's; a tiny Diffusers pipeline with `device_map="balanced"`. Prints one JSON line."""

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


def balanced_pipeline() -> dict:
    """Diffusers' `device_map="balanced"`: a tiny Stable Diffusion pipeline saved offline and loaded with its
    components spread over tpu:0 and tpu:1 (a memory budget per device), its images against CPU's."""
    import diffusers
    from _hf_diffusers_tiny import sd_call, stable_diffusion

    path = tempfile.mkdtemp()
    stable_diffusion().save_pretrained(path)
    cls, kw = diffusers.StableDiffusionPipeline, dict(safety_checker=None, requires_safety_checker=False)
    with cpu_reference():
        cpu = cls.from_pretrained(path, **kw)
        cpu.set_progress_bar_config(disable=True)
        ref = cpu(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    pipe = cls.from_pretrained(path, device_map="balanced", max_memory={0: 10**9, 1: 10**9}, **kw)
    pipe.set_progress_bar_config(disable=True)
    images = pipe(**sd_call(), generator=torch.Generator().manual_seed(0)).images
    # without a budget, Accelerate's get_max_memory offers only the current tpu device (its rule: a TPU
    # process uses one chip), so "balanced" has one device to balance over
    unbudgeted = cls.from_pretrained(path, device_map="balanced", **kw)
    return {"map": {k: str(v) for k, v in pipe.hf_device_map.items()},
            "param_devices": sorted({str(p.device) for c in pipe.components.values()
                                     if isinstance(c, torch.nn.Module) for p in c.parameters()}),
            "images_err": rel_err(ref, images.cpu()),
            "unbudgeted_map": sorted({str(v) for v in unbudgeted.hf_device_map.values()})}


if __name__ == "__main__":
    result = main()
    result["balanced_pipeline"] = balanced_pipeline()
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
