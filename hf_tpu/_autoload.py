"""PyTorch's device-backend autoload calls `autoload()` on `import torch` (entry point group
`torch.backends`), so `device="tpu"` works without `import hf_tpu`. It must stay cheap: no JAX here."""

import os


def _step_in_for_torch_tpu() -> None:
    """torch_tpu is installed but no TPU chip is attached. Its own autoload entry point
    (`torch_tpu._loader:load`), if torch calls it after ours, would register a `tpu` with no device behind
    it, colliding with ours: a no-op loader in its place lets hf-tpu serve `tpu`. (When torch calls torch_tpu's
    entry point first, only the start-up guard, _hf_tpu_guard.py, run by hf_tpu_guard.pth before torch,
    can help: torch_tpu's loader aborts the process.)"""
    import importlib.util

    if importlib.util.find_spec("torch_tpu") is None:
        return
    from hf_tpu import device

    device.guard().install_stand_in_loader()


def autoload() -> None:
    if os.environ.get("HF_TPU_DISABLE") == "1":
        return
    from hf_tpu import device

    if device.real_torch_tpu_present():
        return  # the real TorchTPU serves `tpu`
    _step_in_for_torch_tpu()
    device.register()
