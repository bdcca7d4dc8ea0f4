"""Keeps `import torch` alive when torch_tpu is installed beside hf-tpu on a host without TPU chips, whatever
order torch finds the two packages' device-backend entry points in.

torch's autoload (`torch._import_device_backends`) calls every `torch.backends` entry point in the order
importlib.metadata lists the installed distributions: sys.path order, and within one site-packages the
directory's listing order, which is arbitrary. torch_tpu's (`torch_tpu._loader:load`), without chips, aborts
the process (a failed C++ CHECK: TPU_LIBRARY_PATH unset) before hf-tpu's entry point can step in. So the
stand-in's loader has to be in place before torch runs any entry point, and this module does it from a start-up
file (hf_tpu_guard.pth, installed by setup.py into site-packages beside hf-tpu; Python's `site` runs it
when the interpreter starts):

- at start-up it only appends a meta-path finder: no import, no file system access;
- that finder does nothing until `torch` itself is first looked up. Then (sys.path complete by now) it removes
  itself and, if torch_tpu is installed, no TPU chip is attached and hf-tpu is not disabled (HF_TPU_DISABLE=1),
  it puts a no-op module in place of `torch_tpu._loader`, so whichever entry point torch calls first, torch_tpu's
  does nothing and hf-tpu's registers `tpu`. With chips attached, torch_tpu loads as it would without hf-tpu.

This module stands alone (modules Python has loaded at start-up already; not even typing): importing
hf_tpu would import torch.
"""

from __future__ import annotations

import os
import sys
import types

GOOGLE_PCI_VENDOR = "0x1ae0"
LOADER = "torch_tpu._loader"


def tpu_chips_present(sys_pci: str = "/sys/bus/pci/devices", dev: str = "/dev") -> bool:
    """Whether a TPU chip is attached, detected as torch_tpu detects it: a PCI device of Google's vendor id
    (0x1ae0) exposed to user space through VFIO (its IOMMU group under /dev/vfio) or through the kernel's
    accel driver (an accel node under the device). Any other VFIO or accel device is not a TPU."""
    try:
        devices = os.listdir(sys_pci)
    except OSError:
        return False
    for name in devices:
        path = os.path.join(sys_pci, name)
        try:
            with open(os.path.join(path, "vendor")) as f:
                if f.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
        except OSError:
            continue
        group = os.path.join(path, "iommu_group")
        if os.path.islink(group) and os.path.exists(os.path.join(dev, "vfio", os.path.basename(os.readlink(group)))):
            return True
        if os.path.isdir(os.path.join(path, "accel")):
            return True
    return False


def stand_in_needed() -> bool:
    """torch_tpu is installed, hf-tpu is enabled, and no chip would let torch_tpu start."""
    import importlib.util

    if os.environ.get("HF_TPU_DISABLE") == "1":
        return False
    if importlib.util.find_spec("torch_tpu") is None:
        return False
    return os.environ.get("HF_TPU_FORCE_STANDIN") == "1" or not tpu_chips_present()


def install_stand_in_loader() -> bool:
    """Puts the no-op loader in place of torch_tpu's (unless torch_tpu's is loaded already). Returns whether
    the stand-in is (now) the loader."""
    current = sys.modules.get(LOADER)
    if current is not None:
        return bool(getattr(current, "__hf_tpu_stand_in__", False))
    stub = types.ModuleType(LOADER, "hf-tpu's stand-in for torch_tpu's loader on a host without TPU chips")
    stub.load = lambda: None  # type: ignore[attr-defined]
    stub.__hf_tpu_stand_in__ = True  # type: ignore[attr-defined]
    sys.modules[LOADER] = stub
    return True


class _BeforeTorch:
    """A meta-path finder that finds nothing: its lookup of `torch` is the moment to act (once)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name != "torch":
            return None
        uninstall()
        try:
            if stand_in_needed():
                install_stand_in_loader()
        except Exception:  # noqa: BLE001 - a start-up hook must never break the import it watches
            pass
        return None


def install() -> None:
    """Called by hf_tpu_guard.pth at interpreter start-up."""
    if "torch" in sys.modules or _BeforeTorch in sys.meta_path:
        return
    sys.meta_path.insert(0, _BeforeTorch)  # type: ignore[arg-type]


def uninstall() -> None:
    while _BeforeTorch in sys.meta_path:
        sys.meta_path.remove(_BeforeTorch)  # type: ignore[arg-type]
