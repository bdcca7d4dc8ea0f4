"""The start-up guard (_hf_tpu_guard.py, run by hf_tpu_guard.pth): `import torch` survives a torch_tpu whose
`torch.backends` entry point torch calls before hf-tpu's and whose loader kills the process on a host without
chips, as torch_tpu 0.2.0's does. A stand-in torch_tpu distribution (its loader calls os._exit, as a failed
CHECK ends the process) sits first on sys.path, so torch finds its entry point first; without the guard the
process dies (the control case), with it hf-tpu serves `tpu`. The real wheel: test_real_torch_tpu.py."""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bare_python

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import torch, sys; x = torch.ones(2, device='tpu') + 1; "
         "print(x.cpu().tolist(), getattr(sys.modules.get('torch_tpu._loader'), '__hf_tpu_stand_in__', False))")


def _fake_torch_tpu(root: Path) -> Path:
    """A distribution named torch_tpu with torch_tpu's entry point; importing its loader ends the process."""
    site = root / "fake_torch_tpu"
    pkg = site / "torch_tpu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from torch_tpu import _loader as _  # noqa: F401 - as torch_tpu 0.2.0\n")
    (pkg / "_loader.py").write_text("import os\nos._exit(134)  # torch_tpu 0.2.0 without TPU_LIBRARY_PATH: a CHECK\n"
                                    "def load():\n    pass\n")
    info = site / "torch_tpu-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_tpu\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_tpu = torch_tpu._loader:load\n")
    return site


def _guard_site(root: Path) -> Path:
    """A directory laid out as a wheel install leaves site-packages: the module, compiled (pip compiles what it
    installs), and the start-up file."""
    site = root / "guard_site"
    site.mkdir()
    shutil.copy(ROOT / "_hf_tpu_guard.py", site)
    shutil.copy(ROOT / "hf_tpu_guard.pth", site)
    py_compile.compile(str(site / "_hf_tpu_guard.py"), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return site


def _run(code: str, pythonpath: list[Path], with_root: bool = True, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_DISABLE", "HF_TPU_FORCE_STANDIN",
                                                           "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    # run outside the work tree: `python -c` puts the working directory first on sys.path, and the tree's
    # _hf_tpu_guard.py would shadow the copy under test
    # and with no start-up files (bare_python): an install's own guard must not stand in for the copy under test
    return subprocess.run(bare_python.argv(code), capture_output=True, text=True, timeout=600, cwd=ROOT.parent,
                          env={**base, "PYTHONPATH": bare_python.pythonpath(*pythonpath, with_root=with_root), **env})


def _entry_point_order(pythonpath: list[Path]) -> list[str]:
    r = _run("from importlib.metadata import entry_points; "
             "print([e.value for e in entry_points(group='torch.backends')])", pythonpath)
    assert r.returncode == 0, r.stderr[-2000:]
    return eval(r.stdout)  # noqa: S307 - our own subprocess's repr of a list of strings


def test_torch_tpu_first_kills_import_torch_without_the_guard(tmp_path: Path) -> None:
    fake = _fake_torch_tpu(tmp_path)
    assert _entry_point_order([fake])[0] == "torch_tpu._loader:load"  # the order this test is about
    r = _run(PROBE, [fake])
    assert r.returncode == 134, (r.returncode, r.stdout, r.stderr[-2000:])


def test_guard_pth_keeps_import_torch_alive_and_hf_tpu_serves_tpu(tmp_path: Path) -> None:
    fake, guard = _fake_torch_tpu(tmp_path), _guard_site(tmp_path)
    # site.addsitedir processes the start-up file as Python's start-up does for site-packages
    r = _run(f"import site; site.addsitedir({str(guard)!r}); " + PROBE, [fake])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "[2.0, 2.0] True", r.stdout


def test_guard_steps_aside_when_disabled(tmp_path: Path) -> None:
    """HF_TPU_DISABLE=1: hf-tpu stays out of the way, torch_tpu's own loader runs (here: ends the process)."""
    fake, guard = _fake_torch_tpu(tmp_path), _guard_site(tmp_path)
    r = _run(f"import site; site.addsitedir({str(guard)!r}); import torch", [fake], HF_TPU_DISABLE="1")
    assert r.returncode == 134, (r.returncode, r.stderr[-2000:])


def test_guard_without_torch_tpu_changes_nothing(tmp_path: Path) -> None:
    guard = _guard_site(tmp_path)
    r = _run(f"import site, sys; site.addsitedir({str(guard)!r}); "
             "import _hf_tpu_guard as g; assert g._BeforeTorch in sys.meta_path; " + PROBE
             + "; assert g._BeforeTorch not in sys.meta_path; assert 'torch_tpu._loader' not in sys.modules", [])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "[2.0, 2.0] False", r.stdout


def test_guard_with_chips_leaves_torch_tpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import _hf_tpu_guard as g

    monkeypatch.delenv("HF_TPU_DISABLE", raising=False)
    monkeypatch.delenv("HF_TPU_FORCE_STANDIN", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torch_tpu" else None)
    monkeypatch.setattr(g, "tpu_chips_present", lambda *a: True)
    assert not g.stand_in_needed()
    monkeypatch.setenv("HF_TPU_FORCE_STANDIN", "1")
    assert g.stand_in_needed()
    monkeypatch.setattr(g, "tpu_chips_present", lambda *a: False)
    monkeypatch.delenv("HF_TPU_FORCE_STANDIN")
    assert g.stand_in_needed()


def test_guard_costs_little_at_start_up(tmp_path: Path) -> None:
    """What the guard adds to every interpreter start, for programs that never import torch: importing its
    compiled module from the start-up file (`-X importtime`'s figure, the fastest of several starts: the
    machine's load only ever adds) and one cheap meta-path lookup per later import."""
    guard = _guard_site(tmp_path)
    own = []
    for _ in range(5):
        r = _run(f"import site; site.addsitedir({str(guard)!r})", [], with_root=False, PYTHONPROFILEIMPORTTIME="1")
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stderr.splitlines() if x.rstrip().endswith("| _hf_tpu_guard"))
        own.append(int(line.split("|")[0].split(":")[1]))  # microseconds, the module itself
    assert min(own) < 2000, f"importing the guard took {min(own)} us"

    import _hf_tpu_guard as g

    calls = 20_000
    best = min(timeit_once(lambda: g._BeforeTorch.find_spec("json"), calls) for _ in range(5))
    assert best / calls < 5e-6, f"{1e9 * best / calls:.0f} ns per lookup"


def timeit_once(fn: object, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return time.perf_counter() - start


def test_hf_tpu_finds_the_guard_beside_it_when_its_name_is_not_importable(tmp_path: Path) -> None:
    """An editable install made before _hf_tpu_guard existed maps only hf_tpu and harness: `import torch` must
    still work (hf_tpu.device loads the module from beside the package)."""
    r = _run("import sys\n"
             "class Block:\n"
             "    @staticmethod\n"
             "    def find_spec(name, *a):\n"
             "        if name == '_hf_tpu_guard' and name not in sys.modules:\n"
             "            raise ModuleNotFoundError(name)\n"
             "sys.meta_path.insert(0, Block)\n" + PROBE, [])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "[2.0, 2.0] False", r.stdout
