"""The real torch_tpu 0.2.0 wheel (from the package index) installed beside hf-tpu, on this host without TPU
chips, in a scratch environment: `import torch` must not die and hf-tpu must serve `tpu`.

torch's device-backend autoload calls the `torch.backends` entry points in the order the installed packages
are found on sys.path (within one site-packages, the directory's arbitrary listing order). When torch_tpu's
entry point comes first, its loader aborts the process (a failed CHECK: TPU_LIBRARY_PATH unset) before
hf-tpu's runs. hf-tpu's start-up file (hf_tpu_guard.pth, installed into site-packages with the package)
puts a no-op loader in place of torch_tpu's before torch starts (_hf_tpu_guard.py), so both orders work; the
scratch environment holds the start-up file and its module as a wheel install leaves them. Without them,
torch_tpu first still kills the process: the control case, which shows what the guard fixes."""

from __future__ import annotations

import glob
import os
import py_compile
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

VERSION = "0.2.0"
WHEEL_DIR = os.environ.get("HF_TPU_TORCH_TPU_WHEEL_DIR", "/tmp/torch_tpu_wheel")
PROBE = ("import torch; x = torch.ones(2, device='tpu') + 1; "
         "import sys; print(x.cpu().tolist(), type(torch.tpu).__module__, "
         "getattr(sys.modules.get('torch_tpu._loader'), '__hf_tpu_stand_in__', False))")


def _wheel() -> str:
    found = glob.glob(os.path.join(WHEEL_DIR, f"torch_tpu-{VERSION}-*.whl"))
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", f"torch-tpu=={VERSION}", "--no-deps", "-d",
                            WHEEL_DIR], capture_output=True, text=True, timeout=600)
        found = glob.glob(os.path.join(WHEEL_DIR, f"torch_tpu-{VERSION}-*.whl"))
        if r.returncode != 0 or not found:
            pytest.skip(f"torch-tpu=={VERSION} cannot be downloaded here: {r.stderr[-300:]}")
    return found[0]


def _scratch(tmp_path: Path, torch_tpu_first: bool, guard: bool = True) -> str:
    """A venv whose sys.path holds this environment's packages (torch, hf-tpu's entry point) and the real
    torch_tpu wheel installed on its own, before or after them; with `guard`, hf-tpu's start-up file and its
    module in the venv's site-packages. Returns its python."""
    tt_site = tmp_path / "torch_tpu_site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(tt_site),
                        _wheel()], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import hf_tpu

    # the hf_tpu under test first, then this environment's packages (torch, hf-tpu's entry point)
    ours = [str(Path(hf_tpu.__file__).parent.parent), sysconfig.get_paths()["purelib"]]
    paths = [str(tt_site), *ours] if torch_tpu_first else [*ours, str(tt_site)]
    Path(site, "scratch_paths.pth").write_text("\n".join(paths) + "\n")
    if guard:
        root = Path(hf_tpu.__file__).parent.parent
        for name in ("_hf_tpu_guard.py", "hf_tpu_guard.pth"):
            shutil.copy(root / name, site)
        py_compile.compile(str(Path(site, "_hf_tpu_guard.py")), doraise=True)
    return python


def _probe(python: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_LIBRARY_PATH")}
    # cwd: a neutral directory. Run from the checkout, sys.path[0] is the checkout, whose hf_tpu.egg-info
    # (left by `pip install -e`) importlib.metadata then lists before torch_tpu's distribution, so hf-tpu's
    # entry point would run first and the order this file tests would not be the one asked for.
    return subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=600,
                          env={**env, "HF_HUB_OFFLINE": "1"}, cwd=os.path.dirname(os.path.dirname(python)))


@pytest.mark.slow
def test_real_torch_tpu_without_chips_hf_tpu_serves_tpu(tmp_path: Path) -> None:
    r = _probe(_scratch(tmp_path, torch_tpu_first=False))
    assert r.returncode == 0, r.stderr[-2000:]
    # torch_tpu's loader was replaced by hf-tpu's no-op one, and torch.tpu is hf-tpu's
    assert r.stdout.split("\n")[0] == "[2.0, 2.0] hf_tpu.tpu_api True", r.stdout


@pytest.mark.slow
def test_real_torch_tpu_found_first_without_chips(tmp_path: Path) -> None:
    r = _probe(_scratch(tmp_path, torch_tpu_first=True))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "[2.0, 2.0] hf_tpu.tpu_api True", r.stdout


@pytest.mark.slow
def test_real_torch_tpu_found_first_without_the_guard_dies(tmp_path: Path) -> None:
    """The control: what the start-up guard fixes (if this starts passing, torch_tpu no longer aborts)."""
    r = _probe(_scratch(tmp_path, torch_tpu_first=True, guard=False))
    assert r.returncode != 0, r.stdout
