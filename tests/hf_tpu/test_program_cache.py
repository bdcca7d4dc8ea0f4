"""The disk tier of eager per-op executables (hf_tpu/compile_cache/programs.py): a warm new process loads
each op's executable instead of tracing and lowering it, and a changed lowering, precision, or a damaged
entry never gives a stale or wrong result. Fresh processes over their own cache directories; CPU PyTorch
is the oracle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHILD = Path(__file__).with_name("program_cache_child.py")
TOL = 1e-4  # precision "highest"


def run(cache: Path, **env: str) -> dict:
    full = {**os.environ, "HF_TPU_CACHE_DIR": str(cache), "HF_TPU_COMPILE_CACHE": "1", "HF_TPU_PROGRAM_CACHE": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    for k in ("HF_TPU_SHARED_CACHE_DIR", "HF_TPU_DISABLE_DISK_CACHE"):
        full.pop(k, None)
    full.update(env)
    r = subprocess.run([sys.executable, str(CHILD)], capture_output=True, text=True, env=full, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    cache = tmp_path_factory.mktemp("programs-cold")
    return cache, run(cache)


def warm_copy(cold: tuple[Path, dict], tmp_path: Path) -> Path:
    shutil.copytree(cold[0], tmp_path / "cache")
    return tmp_path / "cache"


def test_warm_process_loads_executables_instead_of_lowering(cold, tmp_path: Path) -> None:
    cache, first = cold
    assert first["programs"]["saved"] >= 5 and first["programs"]["hits"] == 0
    assert max(first["errs"]) < TOL
    warm = run(warm_copy(cold, tmp_path))
    assert warm["programs"]["hits"] == first["programs"]["saved"] and warm["programs"]["misses"] == 0
    # every program the tier serves is one JAX did not lower again
    assert warm["lowerings"] <= first["lowerings"] - first["programs"]["saved"], (first, warm)
    assert max(warm["errs"]) < TOL and not warm["warnings"]


def test_a_changed_lowering_is_not_served_from_disk(cold, tmp_path: Path) -> None:
    injected = run(warm_copy(cold, tmp_path), CHILD_INJECT="1")
    assert injected["inject_err"] < TOL  # the new lowering ran (a - 0.5 b), not the saved add
    assert injected["programs"]["misses"] >= 1
    assert max(injected["errs"][1:]) < TOL  # the other ops still load, and are right


def test_another_precision_gets_its_own_executables(cold, tmp_path: Path) -> None:
    medium = run(warm_copy(cold, tmp_path), CHILD_PRECISION="medium")
    assert medium["programs"]["misses"] >= 1  # the matmul's program differs by precision
    assert max(medium["errs"]) < 5e-2  # bfloat16 passes: what "medium" means


def test_a_damaged_entry_is_ignored_with_a_warning(cold, tmp_path: Path) -> None:
    cache = warm_copy(cold, tmp_path)
    files = sorted((cache / "programs").glob("*/*.graph"))
    assert files
    for f in files:
        data = bytearray(f.read_bytes())
        data[-20] ^= 0xFF
        f.write_bytes(bytes(data))
    damaged = run(cache)
    assert damaged["programs"]["hits"] == 0 and damaged["programs"]["saved"] >= 1  # compiled and saved again
    assert any("corrupt" in w for w in damaged["warnings"])
    assert max(damaged["errs"]) < TOL


def test_key_describes_only_what_is_the_same_in_every_process() -> None:
    from hf_tpu.compile_cache import programs

    add = torch.ops.aten.add.Tensor
    base = programs.base_key("eager-op", add, lambda a, b: a + b, (1, torch.float32), (), "highest", torch.float32)
    assert base is not None
    assert base != programs.base_key("eager-op", add, lambda a, b: a + b, (1, torch.float32), (), "medium",
                                     torch.float32)
    assert base != programs.base_key("eager-op", add, lambda a, b: a - b, (1, torch.float32), (), "highest",
                                     torch.float32)
    k = 2
    assert programs.base_key("eager-op", add, lambda a: a * k, (), (), "highest", torch.float32) != \
        programs.base_key("eager-op", add, (lambda k: lambda a: a * k)(3), (), (), "highest", torch.float32)
    assert programs.base_key("eager-op", add, object(), (), (), "highest", torch.float32) is None  # by address


def test_a_loaded_executable_that_fails_to_run_falls_back_and_is_not_loaded_again(tmp_path, monkeypatch) -> None:
    # an XLA:CPU executable can load and then fail when called, before computing ("Function ... not found")
    import jax.numpy as jnp

    from hf_tpu import runtime
    from hf_tpu.compile_cache import programs, store

    monkeypatch.setenv("HF_TPU_CACHE_DIR", str(tmp_path))
    JaxRuntimeError = type("JaxRuntimeError", (RuntimeError,), {})  # what XLA raises, by name

    class Broken:
        def __call__(self, *arrays):  # noqa: ANN002, ANN204
            raise JaxRuntimeError("NOT_FOUND: Function concatenate_bitcast_fusion not found")

    jitted = runtime.jax().jit(lambda a, b: a + b)
    prog = programs.DiskProgram(jitted, "0" * 64)
    a = jnp.ones(3)
    broken = Broken()
    prog.compiled[(a.aval, a.aval)] = broken
    programs._loaded[id(broken)] = "ab" * 16
    with pytest.warns(RuntimeWarning, match="failed to run"):
        out = prog(a, a)
    assert out.tolist() == [2.0, 2.0, 2.0]  # served by the jitted function
    assert store.is_unsaveable(runtime.program_cache_dir(), "ab" * 16)  # later processes skip the entry
    assert programs._load("ab" * 16) is None
    # an error of a program compiled in this process is the op's own: raised
    other = programs.DiskProgram(jitted, "1" * 64)
    other.compiled[(a.aval, a.aval)] = Broken()
    with pytest.raises(JaxRuntimeError):
        other(a, a)
