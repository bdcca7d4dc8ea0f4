"""Every patch hf_tpu applies to Transformers, Accelerate, safetensors and PyTorch itself, one module per
upstream library (transformers_patches.py, accelerate_patches.py, kernels_patches.py, safetensors_patches.py,
torch_patches.py).

Upstream already treats `tpu` right almost everywhere: `from_pretrained(device_map="tpu")`, `{"": "tpu:0"}`,
`dtype=`, sharded and `.bin` checkpoints, `pipe.to("tpu")`, and `generate`'s own compile (Transformers
picks `CompileConfig(backend="tpu", dynamic=False)` for a `tpu` model). A patch exists only where a test
in tests/hf_tpu/integration/test_hf_patches.py fails without it; each names the upstream behaviour it fixes.

Each patch is a factory decorated with `@patch(module, attribute, name)` (registry.py), which registers it
and does the guard-replace-mark routine once; `registered()` lists them all (name, module, attribute):
    python -c "from hf_tpu import patches; print(*patches.registered(), sep='\\n')"

How they get applied without `import hf_tpu`: `import torch` autoloads hf_tpu (the `torch.backends` entry
point imports this package, whose __init__ calls `install()`). `install()` must stay cheap, so it imports
neither transformers nor accelerate: it puts an import hook (hook.py) on `sys.meta_path` that patches a
target module right after the module's own code has run (or at once, if it is already imported).

`applied()` lists the patches applied in this process; HF_TPU_NO_PATCHES=1 turns them all off (the tests
use it to show each patch is needed).
"""

from __future__ import annotations

# registering modules: importing them fills the registry (none imports its upstream library at import)
from hf_tpu.patches import (  # noqa: F401
    accelerate_patches,
    kernels_patches,
    safetensors_patches,
    torch_patches,
    transformers_patches,
)
from hf_tpu.patches.hook import applied, apply_pending, install
from hf_tpu.patches.registry import patch, registered
from hf_tpu.patches.transformers_patches import CheckpointFileError

__all__ = ["CheckpointFileError", "applied", "apply_pending", "install", "patch", "registered"]
