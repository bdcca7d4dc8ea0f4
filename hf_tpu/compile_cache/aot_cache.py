"""AOTAutograd's own cache behind Dynamo, for the graphs the graph cache cannot save.

A call with a graph break takes the ordinary torch.compile path (cached.py), so a new process runs Dynamo
and, for each subgraph, AOTAutograd again. PyTorch's AOTAutogradCache can skip the second part for any
backend whose compiler is a `SerializableAOTDispatchCompiler` (torch/_functorch/aot_autograd.py): the
tpu backend's ordinary path uses the same serializable compiler as the graph cache (serializable.py), so a
hit loads the subgraph's functional ATen graph and lowers it with today's backend (a changed lowering
shows, as with the graph cache).

PyTorch keys an entry by the Dynamo graph, its inputs' metadata, torch's version and configs, but not by
the decompositions a backend applies: the entries live in a directory named by hf_tpu's own salt (the
versions and hf_tpu's compile sources, as keys.versions(), and the lowering table), under the graph
cache's host directory. Host tier only (AOTAutogradCache has no shared tier of its own).
HF_TPU_AOT_CACHE=0, or HF_TPU_COMPILE_CACHE=0, turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch


def enabled() -> bool:
    return os.environ.get("HF_TPU_AOT_CACHE", "1") != "0" and os.environ.get("HF_TPU_COMPILE_CACHE", "1") != "0"


def salt() -> str:
    from hf_tpu import lowering

    # Cached per lowering table: hf_tpu.hooks.override_lowerings (the harness's fault injection, diagnose)
    # swaps `lowering.find` for the block, which changes which ops are decomposed; an entry saved under it
    # (a graph decomposed to ops that only the override lacked) must not be loaded after it, nor before.
    return _salt(lowering.find)


@functools.cache
def _salt(find: object) -> str:
    from hf_tpu.compile_cache import keys

    text = json.dumps({"versions": keys.versions(), "lowerings": keys.lowering_fingerprint()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def directory() -> Path:
    from hf_tpu.compile_cache import store

    return store.host_dir() / "aotautograd" / salt()


@contextlib.contextmanager
def active() -> Iterator[None]:
    """AOTAutograd's cache on, in hf_tpu's directory, for one backend call (the ordinary path's)."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    where = str(directory())
    original = AOTAutogradCache.__dict__["_get_tmp_dir"]
    # PyTorch's directory is Inductor's cache_dir(); ours carries the salt (see the module docstring)
    AOTAutogradCache._get_tmp_dir = classmethod(lambda cls: where)  # type: ignore[method-assign]
    try:
        # force_non_lazy_backward_lowering: the backward compiled now, in this block, as aot_compile_fullgraph
        # does. Compiled lazily (AOTAutograd's default) at the first backward, it ran outside the block, where
        # bundled_autograd_cache is off and the entry is not saved: no training graph was ever saved, and every
        # process ran AOTAutograd again for each subgraph of a model with graph breaks.
        with torch._functorch.config.patch(enable_autograd_cache=True, bundled_autograd_cache=True,
                                           force_non_lazy_backward_lowering=True), \
                torch._inductor.config.patch(fx_graph_cache=True):
            yield
    finally:
        AOTAutogradCache._get_tmp_dir = original  # type: ignore[method-assign]


def stats() -> dict[str, int]:
    from torch._dynamo.utils import counters

    c = counters["aot_autograd"]
    return {"hits": int(c.get("autograd_cache_hit", 0)), "misses": int(c.get("autograd_cache_miss", 0)),
            "bypasses": int(c.get("autograd_cache_bypass", 0))}


def reset_stats() -> None:
    from torch._dynamo.utils import counters

    for k in ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"):
        counters["aot_autograd"].pop(k, None)
