"""The invalidation rules of the graph cache (hf_tpu/compile_cache/keys.py): each thing a saved graph
depends on is in its key, so changing it is a miss. Fast, in process."""

from __future__ import annotations

import pytest
import torch

import hf_tpu  # noqa: F401
from hf_tpu import lowering, op_registry
from hf_tpu.compile_cache import artifact, keys


def call(model, inputs):  # noqa: ANN001, ANN201
    return model(**inputs)


def llama(**overrides):  # noqa: ANN003, ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, vocab_size=128, max_position_embeddings=64)
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return llama()


def key(model, ids=None, fn=call) -> str:  # noqa: ANN001
    ids = torch.zeros(1, 8, dtype=torch.long) if ids is None else ids
    return keys.call_key(fn, (model, {"input_ids": ids}), {})[0]


def test_key_is_stable(model) -> None:
    assert key(model) == key(model) == key(llama())  # same config, a different instance


def test_versions_change_the_key(model, monkeypatch) -> None:
    before = key(model)
    real = keys.versions()
    for pkg in ("torch", "jax", "jaxlib", "transformers", "hf-tpu", "hf_tpu_code", "python"):
        assert pkg in real
        monkeypatch.setattr(keys, "versions", lambda pkg=pkg: {**real, pkg: "0.0.0-other"})
        assert key(model) != before, pkg
        monkeypatch.undo()
    assert key(model) == before


def test_config_changes_the_key(model) -> None:
    assert key(llama(rms_norm_eps=1e-5)) != key(model)
    assert key(llama(hidden_act="gelu")) != key(model)


def test_shapes_and_dtypes_change_the_key(model) -> None:
    base = key(model)
    assert key(model, torch.zeros(1, 9, dtype=torch.long)) != base
    assert key(model, torch.zeros(2, 8, dtype=torch.long)) != base
    assert key(model, torch.zeros(1, 8, dtype=torch.int32)) != base
    assert key(llama().to(torch.bfloat16)) != base  # parameter dtypes


def test_precision_changes_the_key(model, precision) -> None:
    precision("highest")
    high = key(model)
    precision("medium")
    assert key(model) != high


def test_grad_mode_and_function_change_the_key(model) -> None:
    base = key(model)
    with torch.no_grad():
        assert key(model) != base

    def other(model, inputs):  # noqa: ANN001, ANN202
        return model(**inputs).logits

    assert key(model, fn=other) != base


def test_autocast_changes_the_key(model) -> None:
    # one key holds one entry: a bf16 autocast training step and a float32 evaluation of the same model
    # overwrote each other's entry (the saved guards told them apart, the key did not)
    base = key(model)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        bf16 = key(model)
    with torch.autocast("tpu", dtype=torch.float16):
        f16 = key(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_bf16 = key(model)
    assert len({base, bf16, f16, cpu_bf16}) == 4
    with torch.autocast("tpu", dtype=torch.bfloat16, enabled=False):
        assert key(model) == base


def test_lowering_table_changes_the_key(model, monkeypatch) -> None:
    base = key(model)
    # an op gaining a lowering: it is no longer decomposed, so the ATen graph would differ
    keys.lowering_fingerprint.cache_clear()
    monkeypatch.setitem(op_registry.table("jax"), torch.ops.aten.fake_quantize_per_tensor_affine.default,
                        lambda *a, **k: a[0])
    lowering.find.cache_clear()
    try:
        assert key(model) != base
    finally:
        monkeypatch.undo()
        lowering.find.cache_clear()
        keys.lowering_fingerprint.cache_clear()
    assert key(model) == base


@pytest.mark.parametrize("source", ["autocast.py", "meta_kernels.py", "graph_compiler.py"])
def test_sources_that_shape_the_traced_graph_are_keyed(tmp_path, source) -> None:
    # run while AOTAutograd traces, so their changes are in a saved graph: autocast's kernels emit its casts,
    # the meta kernels give its values' shapes and strides (not keyed before: a changed autocast policy was
    # served its old casts from a warm cache)
    import shutil
    from pathlib import Path

    root = Path(keys.__file__).resolve().parents[1]
    copy = tmp_path / "hf_tpu"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "native"))
    before = keys.sources_digest(copy)
    with open(copy / source, "a") as f:
        f.write("\n# changed\n")
    assert keys.sources_digest(copy) != before


def test_changed_source_makes_an_entry_stale() -> None:
    import inspect

    from torch._dynamo.package import _hash_source

    lines, first = inspect.getsourcelines(call)
    good = [(__name__, first, first + len(lines), _hash_source("".join(lines)))]
    artifact.check_sources(good)
    with pytest.raises(artifact.StaleEntry):
        artifact.check_sources([(__name__, first, first + len(lines), _hash_source("changed"))])


def test_cache_dirs_follow_the_environment(tmp_path, monkeypatch) -> None:
    from hf_tpu import runtime

    for var in ("HF_TPU_CACHE_DIR", "HF_TPU_GRAPH_CACHE_DIR", "HF_TPU_SHARED_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert runtime.cache_dir() == tmp_path / "xdg" / "hf_tpu" / "xla"
    assert runtime.graph_cache_dir() == tmp_path / "xdg" / "hf_tpu" / "graphs"
    assert runtime.shared_cache_dir() is None
    monkeypatch.setenv("HF_TPU_CACHE_DIR", str(tmp_path / "c"))  # one variable moves every cache
    assert runtime.graph_cache_dir() == tmp_path / "c" / "graphs"
    monkeypatch.setenv("HF_TPU_GRAPH_CACHE_DIR", str(tmp_path / "g"))
    monkeypatch.setenv("HF_TPU_SHARED_CACHE_DIR", str(tmp_path / "s"))
    assert runtime.graph_cache_dir() == tmp_path / "g" and runtime.shared_cache_dir() == tmp_path / "s"


def test_diffusers_config_key_does_not_depend_on_the_hash_seed() -> None:
    # Diffusers records the defaulted arguments in a list made from a set: its order follows the process's
    # hash seed, and the key with it (Diffusers denoisers never hit in a new process)
    import os
    import subprocess
    import sys

    code = ("import hf_tpu\nfrom diffusers import UNet2DModel\nfrom hf_tpu.compile_cache import keys\n"
            "m = UNet2DModel(sample_size=8, block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1,"
            " down_block_types=('DownBlock2D', 'DownBlock2D'), up_block_types=('UpBlock2D', 'UpBlock2D'))\n"
            "print(len(m.config['_use_default_values']), keys._config_digest(m.config))")
    out = set()
    for seed in ("1", "2", "3"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr[-2000:]
        n, digest = r.stdout.split()[-2:]
        assert int(n) > 2  # enough defaulted arguments for the order to vary
        out.add(digest)
    assert len(out) == 1, out


def test_aotautograd_cache_directory_follows_versions_and_lowering_table(monkeypatch) -> None:
    # PyTorch's AOTAutograd key does not know hf_tpu's decompositions: its entries live under hf_tpu's salt
    from hf_tpu.compile_cache import aot_cache

    aot_cache._salt.cache_clear()
    base = aot_cache.directory()
    monkeypatch.setattr(keys, "lowering_fingerprint", lambda: "another table")
    aot_cache._salt.cache_clear()
    assert aot_cache.directory() != base
    monkeypatch.undo()
    real = keys.versions()
    monkeypatch.setattr(keys, "versions", lambda: {**real, "hf_tpu_code": "edited"})
    aot_cache._salt.cache_clear()
    assert aot_cache.directory() != base
    monkeypatch.undo()
    aot_cache._salt.cache_clear()
    assert aot_cache.directory() == base


SCALE = 2.0


def _times_scale(x):  # noqa: ANN001, ANN202 - reads the global SCALE
    return x * SCALE


def test_closure_and_global_values_change_the_key(monkeypatch) -> None:
    """Dynamo bakes what a function reads from its closure and globals into the graph, and the saved guards
    leave global and identity guards out: before, `lambda x: x * c` compiled for c = 2.0 was served again for
    c = 3.0, and a closed-over torch.sin's graph for torch.cos (wrong results in one process)."""
    def scaled(c):  # noqa: ANN001, ANN202
        return lambda x: x * c

    def applied(f):  # noqa: ANN001, ANN202
        return lambda x: f(x)

    x = torch.zeros(3)
    k = lambda fn: keys.call_key(fn, (x,), {})[0]  # noqa: E731
    assert k(scaled(2.0)) == k(scaled(2.0))
    assert k(scaled(2.0)) != k(scaled(3.0))
    assert k(applied(torch.sin)) == k(applied(torch.sin))
    assert k(applied(torch.sin)) != k(applied(torch.cos))
    before = k(_times_scale)
    monkeypatch.setattr(__import__(__name__), "SCALE", 3.0)
    assert k(_times_scale) != before

    x = torch.randn(5)
    for c in (2.0, 3.0):
        torch._dynamo.reset()
        out = torch.compile(scaled(c), backend="tpu", dynamic=False)(x.to("tpu")).cpu()
        torch.testing.assert_close(out, x * c)
    for f in (torch.sin, torch.cos):
        torch._dynamo.reset()
        out = torch.compile(applied(f), backend="tpu", dynamic=False)(x.to("tpu")).cpu()
        torch.testing.assert_close(out, f(x))
