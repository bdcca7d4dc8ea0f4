"""Several tpu devices on one host (hf_tpu/devices.py): HF_TPU_NUM_DEVICES=2 gives tpu:0 and tpu:1 on two
JAX CPU devices. JAX fixes its device count when it starts, so each case runs in a fresh process
(multi_device_child.py for the behaviour, a one-liner for the configuration errors); CPU PyTorch is the
oracle for values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("multi_device_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(code_or_file: str | Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("HF_TPU_NUM_DEVICES", "TORCH_TPU_DEVICES_PER_HOST", "LOCAL_WORLD_SIZE")}
    full.update(env, PYTHONPATH=str(ROOT) + os.pathsep + full.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(code_or_file)] if isinstance(code_or_file, Path) else [sys.executable, "-c", code_or_file]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)


def _result(r: subprocess.CompletedProcess) -> dict:
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"child failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def two() -> dict:
    return _result(_run(CHILD, HF_TPU_NUM_DEVICES="2"))


def test_count_and_placement(two: dict) -> None:
    assert two["tpu_count"] == two["accel_count"] == 2
    assert two["devices"] == ["tpu:0", "tpu:1"]
    assert two["jax_devices"] == [0, 1]  # each device's arrays on its own JAX device
    assert two["op_device"] == "tpu:1" and two["op_jax"] == 1
    assert two["op_err"] < 1e-5
    assert two["copy"] == ["tpu:0", 0, True]  # .to("tpu:0") of a tpu:1 tensor is a transfer
    # factories, views and random draws on tpu:1 stay there
    assert two["made"] == ["tpu:1/1"]


def test_mixed_devices_raise_pytorchs_error(two: dict) -> None:
    assert "Expected all tensors to be on the same device" in two["mixed"] and "tpu:0 and tpu:1" in two["mixed"]
    assert "Expected all tensors to be on the same device" in two["mixed_cpu"] and "tpu:1 and cpu" in two["mixed_cpu"]


def test_current_device_and_bad_index(two: dict) -> None:
    assert two["current"] == [1, 1, "tpu:1", 0, "tpu:0", 1]
    for msg in two["bad_index"]:
        assert "is not a valid device" in msg and "HF_TPU_NUM_DEVICES=2" in msg, msg


def test_memory_per_device(two: dict) -> None:
    assert two["memory_delta"] == [0, 256 * 1024 * 4]
    assert two["accel_memory_1"]


def test_model_split_over_devices_matches_cpu(two: dict) -> None:
    split = two["split"]
    assert split["devices"] == ["tpu:0", "tpu:1", "tpu:1"]
    assert split["loss_err"] < 1e-5 and split["grad_err"] < 1e-5
    assert two["after_step"] == ["tpu:0", "tpu:1"]


USE = "import torch; print(torch.tpu.device_count(), torch.ones(1, device='tpu:1').device)"


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_bad_count_is_a_clear_error(value: str) -> None:
    # import torch still works (the variable is read when tpu is first used), the first use says what is wrong
    r = _run("import torch, sys; x = torch.empty(0); print('imported', flush=True); torch.ones(1, device='tpu')",
             HF_TPU_NUM_DEVICES=value)
    assert "imported" in r.stdout and r.returncode != 0
    assert f"HF_TPU_NUM_DEVICES={value!r}" in r.stderr or f"HF_TPU_NUM_DEVICES={value}" in r.stderr, r.stderr[-2000:]


def test_torch_tpu_devices_per_host_is_honoured() -> None:
    r = _run(USE, TORCH_TPU_DEVICES_PER_HOST="2")
    assert r.stdout.split() == ["2", "tpu:1"], r.stderr[-2000:]
    # HF_TPU_NUM_DEVICES wins over torch_tpu's variable
    r = _run("import torch; print(torch.tpu.device_count())", TORCH_TPU_DEVICES_PER_HOST="3", HF_TPU_NUM_DEVICES="1")
    assert r.stdout.split() == ["1"], r.stderr[-2000:]


def test_torchrun_local_world_size_gives_a_device_per_local_rank() -> None:
    # each torchrun rank then has tpu:LOCAL_RANK, as each rank on a CUDA host sees every GPU
    r = _run(USE, LOCAL_WORLD_SIZE="2")
    assert r.stdout.split() == ["2", "tpu:1"], r.stderr[-2000:]
