"""`import hf_tpu` before `import torch` (and after JAX): torch's autoload must not meet a half-imported
hf_tpu.device ("Failed to load the backend extension: hf_tpu")."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("first", ["import hf_tpu", "import jax, hf_tpu", "import hf_tpu.dispatch"])
def test_hf_tpu_imported_before_torch(first):
    # the compile cache is installed too (the device was registered by autoload while hf_tpu was importing)
    code = (f"{first}\nimport torch\nassert hasattr(torch.compile, '__hf_tpu_original__'), 'no graph cache'\n"
            "print(torch.ones(2, device='tpu').sum().item())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "2.0"
