"""PyTorch's device-backend autoload calls `autoload()` on `import torch` (entry point group
`torch.backends`), so `device="tpu"` works without `import hf_tpu`. It must stay cheap: no JAX here."""

import os


def autoload() -> None:
    if os.environ.get("HF_TPU_DISABLE") == "1":
        return
    from hf_tpu import device

    if device.real_torch_tpu_present():
        return  # the real TorchTPU serves `tpu`
    device.register()
