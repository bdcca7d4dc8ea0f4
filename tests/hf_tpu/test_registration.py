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


def test_steps_aside_for_real_torch_tpu(monkeypatch, tmp_path) -> None:
    # A host with torch_tpu installed and a TPU chip attached, as torch_tpu detects one: a PCI device of
    # Google's vendor id whose IOMMU group is exposed under /dev/vfio (the real chip detection, on a fake tree).
    import functools
    import importlib.util

    from hf_tpu import _autoload

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_tpu" else find_spec(name, *a))
    chip = tmp_path / "sys" / "0000:00:04.0"
    chip.mkdir(parents=True)
    (chip / "vendor").write_text(device.GOOGLE_PCI_VENDOR + "\n")
    (tmp_path / "groups" / "3").mkdir(parents=True)
    (chip / "iommu_group").symlink_to(tmp_path / "groups" / "3")
    (tmp_path / "dev" / "vfio" / "3").mkdir(parents=True)
    monkeypatch.setattr(device, "tpu_chips_present",
                        functools.partial(device.tpu_chips_present, str(tmp_path / "sys"), str(tmp_path / "dev")))
    registered = []
    monkeypatch.setattr(device, "register", lambda: registered.append(True) or True)
    monkeypatch.delitem(sys.modules, "torch_tpu._loader", raising=False)

    assert device.real_torch_tpu_present()
    _autoload.autoload()  # torch's autoload entry point: leaves `tpu` and torch_tpu's loader to torch_tpu
    assert registered == [] and "torch_tpu._loader" not in sys.modules

    (tmp_path / "dev" / "vfio" / "3").rmdir()  # torch_tpu installed, no chip: hf-tpu serves `tpu`
    assert not device.real_torch_tpu_present()
    _autoload.autoload()
    assert registered == [True] and sys.modules["torch_tpu._loader"].__hf_tpu_stand_in__


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


_THREADED_FIRST_USE = """
import faulthandler, threading
faulthandler.dump_traceback_later(200, exit=True)  # a hang prints every thread's stack, then fails the run
from concurrent.futures import ThreadPoolExecutor
import torch
n = 8
barrier = threading.Barrier(n)
def load(i):
    barrier.wait()  # every thread's first tpu op at once
    return (torch.full((4, 3), float(i))[1:3].to("tpu") * 2).cpu()
with ThreadPoolExecutor(n) as pool:
    got = list(pool.map(load, range(n)))
assert all(torch.equal(g, torch.full((2, 3), 2.0 * i)) for i, g in enumerate(got)), got
print("ok")
"""


def test_first_op_from_many_threads_at_once() -> None:
    # Transformers' loader moves weights to the device in a thread pool, so a process's first tpu op (which
    # imports the lowerings and JAX, and registers the kernels under device._first_op_lock) often runs in
    # several threads at once. Every thread must get its result: without the lock the late threads called
    # an unbound dispatch ("'NoneType' object is not callable"), and a lock taken in the wrong order would hang.
    r = _python(_THREADED_FIRST_USE)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok"]
