"""`import torch` autoloads hf_tpu, which patches Transformers/Accelerate: every import order people use must
work, each in a fresh process (a library imported first is still running its own code when torch, and so
hf_tpu, gets imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ORDERS = {
    "torch first": "import torch",
    "transformers first": "import transformers",
    "transformers.modeling_utils first": "import transformers.modeling_utils",
    "transformers.pytorch_utils first": "import transformers.pytorch_utils",
    "from transformers import AutoModel": "from transformers import AutoModel",
    "diffusers first": "import diffusers",
    "accelerate first": "import accelerate",
    "accelerate.utils.modeling first": "import accelerate.utils.modeling",
}

# Run right after the first import, before anything else is imported: the patches of a module that was
# half-run when hf_tpu was loaded must be in place by now (applied() completes them).
CHECK = textwrap.dedent("""
    import sys
    patches = sys.modules.get("hf_tpu.patches")  # absent if nothing has imported torch yet
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is not None:
        applied = patches.applied()
        for name in ("tpu_unavailable_error", "tpu_skip_allocator_warmup", "checkpoint_file_errors"):
            assert name in applied, (name, applied)
        for f in (mu.check_and_set_device_map, mu.caching_allocator_warmup):
            assert getattr(f, "_hf_tpu_patched", False), f
    import torch, copy
    import transformers.modeling_utils as mu, transformers.pytorch_utils as pu
    import transformers.core_model_loading as cml, accelerate.utils as au, accelerate.utils.modeling as am
    patched = [mu.check_and_set_device_map, mu.caching_allocator_warmup, cml._materialize_copy,
               am.get_max_memory, au.get_max_memory, torch.Tensor.__deepcopy__]
    missing = [f"{f.__module__}.{f.__name__}" for f in patched if not getattr(f, "_hf_tpu_patched", False)]
    assert not missing, missing
    a, b = torch.ones(2, device="tpu"), torch.ones(2, device="tpu")
    # unpatched: tpu tensors' data_ptr() tells buffers apart, as Transformers' shared-storage check needs
    assert mu.id_tensor_storage(a) != mu.id_tensor_storage(b) and pu.id_tensor_storage is mu.id_tensor_storage
    assert mu.id_tensor_storage(a[1:]) == mu.id_tensor_storage(a)
    assert copy.deepcopy(a).cpu().tolist() == [1.0, 1.0]
    print("ok")
""")


@pytest.mark.parametrize("first", list(ORDERS.values()), ids=list(ORDERS))
def test_import_order(first: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_NO_PATCHES", "HF_TPU_DISABLE",
                                                              "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    r = subprocess.run([sys.executable, "-c", first + "\n" + CHECK], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_failing_patch_does_not_break_import_torch() -> None:
    # a patch that raises (an upstream rename, say) warns instead of failing `import torch`
    code = textwrap.dedent("""
        import types, sys, warnings
        fake = types.ModuleType("transformers.core_model_loading")  # lacks _materialize_copy
        fake.__spec__ = None
        sys.modules["transformers.core_model_loading"] = fake
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        assert any("could not apply" in str(w.message) for w in caught), [str(w.message) for w in caught]
        print(torch.ones(1, device="tpu").cpu().tolist())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0 and r.stdout.strip() == "[1.0]", r.stderr[-3000:]
