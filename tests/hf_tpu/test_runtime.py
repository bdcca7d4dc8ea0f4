"""hf_tpu/runtime.py: the XLA:CPU fast-compile flags (set before JAX starts, never over the user's)."""

import os
import subprocess
import sys

import pytest

from hf_tpu import runtime

CODE = "import os, torch; (torch.ones(2, device='tpu') + 1).cpu(); print(os.environ.get('XLA_FLAGS'))"


def _flags(**env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "HF_TPU_XLA_FAST_COMPILE", "JAX_PLATFORMS")}
    res = subprocess.run([sys.executable, "-c", CODE], env={**full, **env}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not runtime._cpu_only(), reason="the flags are for XLA:CPU only")
def test_fast_compile_flags_are_set_before_jax_starts_and_respect_the_user():
    flags = _flags()
    assert all(f in flags for f in runtime.FAST_COMPILE_FLAGS), flags
    mine = _flags(XLA_FLAGS="--xla_backend_optimization_level=2")
    assert "--xla_backend_optimization_level=2" in mine and "--xla_backend_optimization_level=0" not in mine
    assert "--xla_cpu_use_fusion_emitters=false" in mine
    assert _flags(HF_TPU_XLA_FAST_COMPILE="0") == "None"


def test_not_cpu_only_when_jax_platforms_names_an_accelerator(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert not runtime._cpu_only()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert runtime._cpu_only()
