"""`tpu` exists after `import torch` alone, cheaply, and steps aside for the real torch_tpu."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import hf_tpu
from hf_tpu import device


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_fresh_shell_needs_no_import() -> None:
    r = _python("import torch; print(torch.ones(2, device='tpu') + 1)")
    assert r.returncode == 0, r.stderr
    assert "tensor([2., 2.], device='tpu:0')" in r.stdout


def test_import_torch_does_not_start_jax() -> None:
    r = _python("import sys, torch; torch.device('tpu'); print('jax' in sys.modules, 'torchax' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_disabled_leaves_tpu_unregistered() -> None:
    r = _python("import torch; torch.device('tpu')", HF_TPU_DISABLE="1")
    assert r.returncode != 0
    assert "tpu" in r.stderr


def test_steps_aside_for_real_torch_tpu(monkeypatch) -> None:
    import glob
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torch_tpu" else None)
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/accel0"] if "accel" in pattern else [])
    assert device.real_torch_tpu_present()
    monkeypatch.setattr(glob, "glob", lambda pattern: [])  # torch_tpu installed, no chips: we serve tpu
    assert not device.real_torch_tpu_present()


def test_backend_info() -> None:
    info = hf_tpu.backend_info()
    assert info["backend"] == "hf_tpu"
    assert info["platform"] == "cpu"
    assert info["matmul_precision"] in ("highest", "high", "medium")


def test_device_module_and_accelerator() -> None:
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.synchronize()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch._C._get_privateuse1_backend_name() == "tpu"


def test_transformers_sees_tpu() -> None:
    from transformers.utils import import_utils

    fn = getattr(import_utils, "is_torch_tpu_available", None) or getattr(import_utils, "is_torch_accelerator_available", None)
    if getattr(import_utils, "is_torch_tpu_available", None) is not None:
        assert import_utils.is_torch_tpu_available()
    assert fn is not None
    assert torch.accelerator.current_accelerator().type == "tpu"
