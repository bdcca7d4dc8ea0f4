"""Compiled programs persist on disk: a second process compiling the same graph hits the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, time, torch, hf_tpu
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)]).to("tpu")
x = torch.randn(4, 64).to("tpu")
f = torch.compile(m, backend="tpu")
t = time.perf_counter()
f(x).cpu()
print(json.dumps({"first_call_s": time.perf_counter() - t, **hf_tpu.compile_stats()}))
"""


def _run(cache_dir: str, script: str = SCRIPT, **env_vars: str) -> dict:
    env = {**os.environ, "HF_TPU_CACHE_DIR": cache_dir, **env_vars}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_hits_disk_cache(tmp_path) -> None:
    cold = _run(str(tmp_path))
    assert cold["cache_hits"] == 0 and cold["compilations"] == 1
    assert any(tmp_path.iterdir()), "nothing was written to the cache directory"
    warm = _run(str(tmp_path))
    assert warm["cache_hits"] >= 1
    assert warm["cache_misses"] == 0


# A graph whose as_strided reads a view's storage (offsets into the storage of an intermediate value, as the
# train phase's backward of some zoo models does): the next process loads the graph and must lower it
# against the same storage offsets and shared storages the saving process traced.
OFFSET_SCRIPT = r"""
import json, torch, hf_tpu
torch.manual_seed(0)
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8))
    def forward(self, x):
        h = x * self.w                                   # a fresh 4x8 value
        y = h[:, 2:].as_strided((3, 2), (8, 1), 3)       # elements 3.. of h's storage, through a slice's view
        z = h[:, 5:].as_strided((4, 3), (8, 1), 0)       # an offset before the slice's own first element
        return y.sum() + (y * y).sum() + (z * z).sum()
m = M()
x = torch.randn(4, 8)
ref = m(x)
ref.backward()
mt = M().to("tpu")
mt.load_state_dict(m.state_dict())
out = torch.compile(mt, backend="tpu")(x.to("tpu"))
out.backward()
print(json.dumps({"loss": out.item(), "ref": ref.item(), "grad_err": (mt.w.grad.cpu() - m.w.grad).abs().max().item(),
                  **hf_tpu.compile_stats()}))
"""


def test_second_process_keeps_storage_offsets(tmp_path) -> None:
    runs = [_run(str(tmp_path), OFFSET_SCRIPT, HF_TPU_COMPILE_CACHE="1") for _ in range(2)]  # the graph cache on
    assert runs[0]["tiers"]["saved"] >= 1 and runs[1]["tiers"]["host"]["hits"] >= 1, runs
    for r in runs:  # before: the loading process computed another loss (12.8 for 0.54) or raised out of bounds
        assert abs(r["loss"] - r["ref"]) <= 1e-5 * abs(r["ref"]), r
        assert r["grad_err"] <= 1e-5, r


def test_key_tells_storage_offsets_apart() -> None:
    """A graph traced with an input at another storage offset is another graph (as_strided reads the offset)."""
    import torch

    from hf_tpu.compile_cache import keys

    base = torch.arange(12.0)
    assert keys.describe(base[2:6]) != keys.describe(base[0:4])
    assert keys.describe(base[2:6]) == keys.describe(torch.arange(12.0)[2:6])
