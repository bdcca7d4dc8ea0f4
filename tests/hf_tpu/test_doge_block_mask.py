"""Doge with `tpu` as the accelerator (patches/transformers_patches.py, doge_block_mask): Transformers then
reports flex attention unavailable, so modeling_doge never imports `BlockMask`, which its mask code tests
on every call. The oracle is the same model in a process without hf_tpu (flex attention available, the
upstream path), whose logits hf_tpu's CPU eager and tpu compiled runs must equal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from hf_tpu.precision import cpu_reference

_CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)


def _upstream_logits(out: Path) -> None:
    """Build the model, run it and save weights, ids and logits, in a process where hf_tpu is not loaded."""
    code = textwrap.dedent(f"""
        import sys, torch
        from transformers import DogeConfig, DogeForCausalLM
        assert "hf_tpu" not in sys.modules
        torch.set_float32_matmul_precision("highest")
        torch.manual_seed(0)
        model = DogeForCausalLM(DogeConfig(**{_CONFIG!r})).eval()
        ids = torch.randint(0, 64, (2, 9))
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        torch.save({{"state": model.state_dict(), "ids": ids, "logits": logits}}, {str(out)!r})
    """)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_doge_runs_with_tpu_as_accelerator_and_matches_upstream(tmp_path: Path, highest: None) -> None:
    from transformers import DogeConfig, DogeForCausalLM

    _upstream_logits(tmp_path / "upstream.pt")
    saved = torch.load(tmp_path / "upstream.pt")
    ids, want = saved["ids"], saved["logits"]
    model = DogeForCausalLM(DogeConfig(**_CONFIG)).eval()
    model.load_state_dict(saved["state"])

    with torch.no_grad(), cpu_reference():
        cpu = model(input_ids=ids).logits  # failed with NameError: name 'BlockMask' is not defined
    torch.testing.assert_close(cpu, want, rtol=1e-5, atol=1e-5)

    torch._dynamo.reset()
    compiled = torch.compile(model.to("tpu"), backend="tpu")
    for n in (9, 5):  # the full length and a prefix: the causal mask must still hold
        with torch.no_grad():
            got = compiled(input_ids=ids[:, :n].to("tpu")).logits.cpu()
        torch.testing.assert_close(got, want[:, :n], rtol=1e-4, atol=1e-4)
