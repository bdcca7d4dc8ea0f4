"""TorchTPU's environment variables and compile options on hf-tpu (issue 28, item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hf_tpu import compile_options, runtime
import bare_python

SCRIPT = r"""
import json, torch, hf_tpu, hf_tpu.compile_cache as cc
seen = []
f = torch.compile(lambda x: torch.sin(x) * 2, backend="tpu",
                  options={"async_compile": True, "num_dynamic_buckets": 2, "bucket_size": 16})
y = f(torch.arange(4.0, device="tpu")).cpu()
print(json.dumps({"ok": torch.allclose(y, torch.sin(torch.arange(4.0)) * 2), **cc.stats()}))
"""


def _run(env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_TPU_", "TORCH_TPU_TIER"))}
    r = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", SCRIPT], capture_output=True, text=True,
                       env={**clean, **env}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ignoring extra kwargs" not in r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_torch_tpu_cache_tiers_and_options_keep_the_graph_cache(tmp_path) -> None:
    tier2, tier3 = tmp_path / "tier2", tmp_path / "tier3"
    env = {"TORCH_TPU_TIER2_COMPILATION_CACHE": str(tier2), "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tier3)}
    cold = _run(env)
    assert cold["ok"] and cold["saved"] >= 1
    assert list(tier3.rglob("*.graph")) and list((tier2 / "graphs").rglob("*.graph"))
    warm = _run(env)
    assert warm["ok"] and warm["host"]["hits"] == 1
    # the old names still work, and win over TorchTPU's
    old = tmp_path / "old"
    warm_old = _run({**env, "HF_TPU_CACHE_DIR": str(old)})
    assert warm_old["host"]["misses"] == 1 and warm_old["shared"]["hits"] == 1 and list(old.rglob("*.graph"))


def test_env_names_map_to_tiers(monkeypatch, tmp_path) -> None:
    for name in ("HF_TPU_CACHE_DIR", "HF_TPU_GRAPH_CACHE_DIR", "HF_TPU_SHARED_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", str(tmp_path / "t2"))
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path / "t3"))
    assert runtime.cache_dir() == tmp_path / "t2" and runtime.graph_cache_dir() == tmp_path / "t2" / "graphs"
    assert runtime.shared_cache_dir() == tmp_path / "t3"
    monkeypatch.setenv("HF_TPU_SHARED_CACHE_DIR", str(tmp_path / "s"))
    assert runtime.shared_cache_dir() == tmp_path / "s"


def test_compile_options_checked_and_honoured() -> None:
    with pytest.raises(ValueError, match="num_dynamic_buckets"):
        compile_options.check({"num_dynamic_buckets": 9})
    with pytest.raises(ValueError, match="bucket_size"):
        compile_options.check({"bucket_size": 0})
    assert compile_options.cacheable({"async_compile": True, "num_dynamic_buckets": 4})
    assert not compile_options.cacheable({"serializable": False})
    seen = []
    f = torch.compile(lambda x: x * 3, backend="tpu", options={"debug_callback": seen.append})
    assert torch.equal(f(torch.ones(2, device="tpu")).cpu(), torch.full((2,), 3.0))
    assert len(seen) == 1 and "mul" in seen[0].pre_autograd_fx_code[0]
    with pytest.raises(Exception, match="bucket_size"):
        torch.compile(lambda x: x + 1, backend="tpu", options={"bucket_size": -1})(torch.ones(2, device="tpu"))


def _pci(root, name: str, vendor: str, group: str | None = None, accel: bool = False) -> None:
    d = root / "sys" / name
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    if group is not None:
        (root / "groups" / group).mkdir(parents=True, exist_ok=True)
        (d / "iommu_group").symlink_to(root / "groups" / group)
    if accel:
        (d / "accel" / "accel0").mkdir(parents=True)


def test_chips_detected_as_torch_tpu_does(tmp_path) -> None:
    from hf_tpu.device import tpu_chips_present

    sys_pci, dev = tmp_path / "sys", tmp_path / "dev"
    (dev / "vfio" / "7").mkdir(parents=True)
    _pci(tmp_path, "0000:00:04.0", "0x10de", group="7")  # an unrelated device behind VFIO (a GPU)
    assert not tpu_chips_present(str(sys_pci), str(dev))
    _pci(tmp_path, "0000:00:05.0", "0x1ae0", group="9")  # a Google device whose group is not exposed
    assert not tpu_chips_present(str(sys_pci), str(dev))
    (dev / "vfio" / "9").mkdir()
    assert tpu_chips_present(str(sys_pci), str(dev))
    other = tmp_path / "other"
    _pci(other, "0000:00:06.0", "0x1ae0", accel=True)  # the accel driver (older TPU VMs)
    assert tpu_chips_present(str(other / "sys"), str(other / "dev"))
    assert not tpu_chips_present(str(tmp_path / "missing"), str(dev))


def test_torch_tpu_without_chips_does_not_kill_import_torch(tmp_path) -> None:
    # A torch_tpu whose loader dies as the real one does without libtpu, installed with an entry point in
    # torch.backends. hf-tpu's autoload puts a no-op loader in its place, so torch's autoload of torch_tpu
    # (after ours) neither dies nor takes `tpu`.
    pkg = tmp_path / "torch_tpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_loader.py").write_text("raise RuntimeError('TPU_LIBRARY_PATH is not set')\ndef load(): pass\n")
    code = ("import importlib, hf_tpu._autoload as a; a.autoload(); "
            "from importlib.metadata import EntryPoint; "
            "EntryPoint('torch_tpu', 'torch_tpu._loader:load', 'torch.backends').load()(); "
            "import torch; print(torch.ones(2, device='tpu').cpu().sum().item(), type(torch.tpu).__module__)")
    # no start-up files (bare_python): an installed start-up guard would stub the loader in the control case too
    env = {**os.environ, "PYTHONPATH": bare_python.pythonpath(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    r = subprocess.run(bare_python.argv(code), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["2.0", "hf_tpu.tpu_api"]
    # without hf-tpu's step-in, that loader kills the process, as torch_tpu kills `import torch`
    r = subprocess.run(bare_python.argv(code.replace("a.autoload(); ", "")), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "TPU_LIBRARY_PATH" in r.stderr
