"""Big-model inference over two tpu devices (HF_TPU_NUM_DEVICES=2, in a fresh process: JAX fixes its device
count when it starts): `from_pretrained(device_map="auto", max_memory={0: ..., 1: ..., "cpu": ...})` splits
a tiny Llama over tpu:0 and tpu:1 (and CPU offload) as on CUDA, and its logits and greedy tokens are CPU's;
Diffusers' `device_map="balanced"` spreads a pipeline's components over both, and its images are CPU's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
HIGHEST_RTOL = 1e-4


@pytest.fixture(scope="module")
def result() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_DEVICES_PER_HOST"}
    env.update(HF_TPU_NUM_DEVICES="2", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(HERE / "multi_device_model_child.py")], capture_output=True, text=True,
                       timeout=900, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"child failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(line[len("RESULT "):])


def test_device_map_auto_splits_over_two_tpu_devices(result: dict) -> None:
    run = result["two_devices"]
    assert run["map"] == ["0", "1"] and run["param_devices"] == ["tpu:0", "tpu:1"]
    assert run["logits_err"] <= HIGHEST_RTOL
    assert run["tokens_equal"]


def test_two_tpu_devices_and_cpu_offload(result: dict) -> None:
    run = result["two_devices_and_cpu"]
    assert run["map"] == ["0", "1", "cpu"]
    assert run["logits_err"] <= HIGHEST_RTOL
    assert run["tokens_equal"]


def test_diffusers_balanced_pipeline_over_two_tpu_devices(result: dict) -> None:
    run = result["balanced_pipeline"]
    assert run["map"] == {"unet": "0", "vae": "1", "text_encoder": "1"}  # largest first, over both devices
    assert run["param_devices"] == ["tpu:0", "tpu:1"]
    assert run["images_err"] <= HIGHEST_RTOL
    assert run["unbudgeted_map"] == ["0"]  # Accelerate's rule for tpu: the current device only
