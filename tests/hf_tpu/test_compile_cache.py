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


def _run(cache_dir: str) -> dict:
    env = {**os.environ, "HF_TPU_CACHE_DIR": cache_dir}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_hits_disk_cache(tmp_path) -> None:
    cold = _run(str(tmp_path))
    assert cold["cache_hits"] == 0 and cold["compilations"] == 1
    assert any(tmp_path.iterdir()), "nothing was written to the cache directory"
    warm = _run(str(tmp_path))
    assert warm["cache_hits"] >= 1
    assert warm["cache_misses"] == 0
