"""PyTorch's device-backend autoload calls `autoload()` on `import torch` (entry point group
`torch.backends`), so `device="tpu"` works without `import hf_tpu`. It must stay cheap: no JAX here."""

import os


def _step_in_for_torch_tpu() -> None:
    """torch_tpu is installed but no TPU chip is attached. Its own autoload entry point
    (`torch_tpu._loader:load`), called by torch after ours, would either kill `import torch` (no libtpu:
    TPU_LIBRARY_PATH unset) or register a `tpu` with no device behind it, colliding with ours. A no-op
    loader in its place lets hf-tpu serve `tpu`. (When torch happens to call torch_tpu's entry point
    before ours, this cannot help: entry points run in the order the installed packages are found.)"""
    import importlib.util
    import sys
    import types

    if "torch_tpu._loader" in sys.modules or importlib.util.find_spec("torch_tpu") is None:
        return
    stub = types.ModuleType("torch_tpu._loader", "hf-tpu's stand-in for torch_tpu's loader on a host without chips")
    stub.load = lambda: None  # type: ignore[attr-defined]
    stub.__hf_tpu_stand_in__ = True  # type: ignore[attr-defined]
    sys.modules["torch_tpu._loader"] = stub


def autoload() -> None:
    if os.environ.get("HF_TPU_DISABLE") == "1":
        return
    from hf_tpu import device

    if device.real_torch_tpu_present():
        return  # the real TorchTPU serves `tpu`
    _step_in_for_torch_tpu()
    device.register()
