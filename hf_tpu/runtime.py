"""JAX, started on first use (never on `import torch`): x64, the persistent compilation cache, the platform."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

CACHE_ENV = "HF_TPU_CACHE_DIR"
GRAPH_CACHE_ENV = "HF_TPU_GRAPH_CACHE_DIR"
SHARED_CACHE_ENV = "HF_TPU_SHARED_CACHE_DIR"
# TorchTPU's names for the same tiers: its tier 2 (a host's compilation cache directory) is hf-tpu's host
# tier (XLA programs and graphs, as HF_TPU_CACHE_DIR), its tier 3 root (shared by machines) the shared tier.
# The HF_TPU_* names win when both are set.
TORCH_TPU_TIER2_ENV = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TORCH_TPU_TIER3_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hf_tpu"


def native_build_dir() -> Path:
    """Where hf-tpu's JIT-built C++ (native/hooks.cpp, native/torch_dot.cpp) is kept: $TORCH_EXTENSIONS_DIR
    (PyTorch's own setting for JIT-built extensions), else ~/.cache/hf_tpu/native. Not under $HF_TPU_CACHE_DIR:
    benchmarks and tests point that at empty directories to measure cold compile caches, and each would pay for
    a rebuild of these libraries that has nothing to do with them."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env).expanduser() if env else _user_cache() / "native"


def cache_dir() -> Path:
    """Where compiled XLA programs persist: $HF_TPU_CACHE_DIR, else the per-user cache directory."""
    env = _env(CACHE_ENV, TORCH_TPU_TIER2_ENV)
    if env:
        return Path(env).expanduser()
    return _user_cache() / "xla"


def graph_cache_dir() -> Path:
    """The host tier of the graph cache (compile_cache/): $HF_TPU_GRAPH_CACHE_DIR, else `graphs/` inside
    $HF_TPU_CACHE_DIR when that is set (one variable moves every cache; JAX ignores subdirectories), else
    ~/.cache/hf_tpu/graphs next to the XLA cache."""
    env = os.environ.get(GRAPH_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    if _env(CACHE_ENV, TORCH_TPU_TIER2_ENV):
        return cache_dir() / "graphs"
    return _user_cache() / "graphs"


def shared_cache_dir() -> Path | None:
    """The optional shared tier: $HF_TPU_SHARED_CACHE_DIR (a directory many machines mount), or None."""
    env = _env(SHARED_CACHE_ENV, TORCH_TPU_TIER3_ENV)
    return Path(env).expanduser() if env else None


# XLA:CPU spends most of a tiny program's life compiling it (~50 ms for `x + 1` here), and the stand-in
# compiles thousands: one per eager op and shape. Without the fusion emitters and LLVM's optimisation
# passes compiles take about half as long (a tiny Llama's first eager forward: 8-13 s -> 4.5-6.5 s; its
# whole-graph compile: 4.5 s -> 1.6 s) and compute the same values (no fast-math either way); the code is
# slower, which tiny programs barely notice. Only when JAX can reach no accelerator, never over a flag the
# user set, and HF_TPU_XLA_FAST_COMPILE=0 turns it off. Large programs are compiled with XLA's defaults
# instead (per program: xla_options.py); FAST_COMPILE_MARK_ENV lists the flags hf-tpu added, so that a child
# process inheriting XLA_FLAGS still tells them from a user's.
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0")
FAST_COMPILE_MARK_ENV = "HF_TPU_FAST_COMPILE_FLAGS_ADDED"
_ACCELERATOR_PLUGINS = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")


def _cpu_only() -> bool:
    import importlib.util

    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.strip().lower() == "cpu"
    return not any(importlib.util.find_spec(p) is not None for p in _ACCELERATOR_PLUGINS)


def add_fast_compile_flags() -> None:
    """Add FAST_COMPILE_FLAGS to XLA_FLAGS, if JAX has not started a backend yet (XLA reads its flags then).
    Called before anything of ours imports JAX (here, and before torchax is imported); asks for the tpu
    devices' JAX CPU devices at the same moment (devices.py), and limits glibc's malloc arenas before JAX's
    threads first allocate (host_malloc.py: peak RSS), as both must happen before JAX starts."""
    from hf_tpu import devices, host_malloc

    devices.add_xla_flag()
    if _cpu_only():  # tpu tensors' buffers live in this process's heap only when JAX runs on the host CPU
        host_malloc.limit_arenas()
        host_malloc.trim_before_backward()  # the free heap given back as a backward starts (peak RSS)
    if os.environ.get("HF_TPU_XLA_FAST_COMPILE", "1") == "0" or not _cpu_only():
        return
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and bridge.backends_are_initialized():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f for f in FAST_COMPILE_FLAGS if f.split("=")[0] not in flags]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
        marked = os.environ.get(FAST_COMPILE_MARK_ENV, "").split()
        os.environ[FAST_COMPILE_MARK_ENV] = " ".join(dict.fromkeys([*marked, *extra]))


def fast_compile_flags_added() -> tuple[str, ...]:
    """The FAST_COMPILE_FLAGS in XLA_FLAGS that hf-tpu put there (in this process or a parent)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return tuple(f for f in os.environ.get(FAST_COMPILE_MARK_ENV, "").split() if f in flags and f in FAST_COMPILE_FLAGS)


def _sync_cpu_dispatch() -> bool:
    """Whether to run XLA:CPU programs on the calling thread (JAX's jax_cpu_enable_async_dispatch=False) when
    the stand-in runs on the host CPU: only when HF_TPU_CPU_ASYNC_DISPATCH=0. By default JAX's asynchronous
    dispatch is kept, as on a real TPU: a program runs on XLA's worker thread while Python dispatches the next
    ops, so the model's Python and hf-tpu's dispatch (~27 CPU-ms of a GPT-2 124M 1x64 forward's ~190) overlap
    the programs instead of adding to them. Measured on this 2-core machine (loaded, each side its own process,
    alternating; logits bit-identical, the same executables run): GPT-2 forward wall 819/895/828 -> 595/593/568
    ms, process CPU 194/211/199 -> 195/189/182 ms, the main thread's CPU 135 -> 27 ms. The cost is a handoff
    for mid-sized programs (XLA:CPU still runs the tiniest inline): a 16 x 64 add 21 -> 28 CPU-us, a
    16-element one 20 -> 18; the tiny Llama's forward 5.9 -> 6.3-6.6 process CPU-ms. (Sync was chosen on an
    earlier measurement that found the handoff doubling a small op's cost.)"""
    return os.environ.get("HF_TPU_CPU_ASYNC_DISPATCH", "1") == "0" and _cpu_only()


AWAIT_GRAPHS_ENV = "HF_TPU_AWAIT_GRAPHS"


@functools.cache
def await_graph_programs() -> bool:
    """Whether a compiled graph's call waits for its XLA program before returning: when the stand-in runs on
    the host CPU with asynchronous dispatch (HF_TPU_AWAIT_GRAPHS=0: never). Why: XLA:CPU keeps a finished
    asynchronous program's whole buffer table (its inputs, outputs and temporaries) alive until the thread
    that dispatched it dispatches another program or one of its outputs is awaited (jax 0.10.2; measured, not
    documented). A compiled backward runs on autograd's device thread, which dispatches nothing more until
    the next backward, so its saved activations, temporaries and gradient outputs stayed resident through the
    optimizer step and the next forward (GPT-2 124M, 4 x 128, bf16 autocast: 0.6-1.1 GB of host memory that
    no array held, benchmarks/step_memory.py); the forward's table likewise stayed through the backward. Its
    caller needs the outputs next anyway, so the wait costs only the overlap of the little Python between
    graphs."""
    return _cpu_only() and not _sync_cpu_dispatch() and os.environ.get(AWAIT_GRAPHS_ENV, "1") != "0"


@functools.cache
def jax() -> Any:
    """Import and configure JAX once; every lowering goes through this."""
    add_fast_compile_flags()
    import jax as _jax

    # int64 must stay int64 and float64 stay float64, as in PyTorch (JAX would silently use 32 bits).
    _jax.config.update("jax_enable_x64", True)
    if _sync_cpu_dispatch():
        _jax.config.update("jax_cpu_enable_async_dispatch", False)
    if os.environ.get("HF_TPU_DISABLE_DISK_CACHE") != "1":
        path = cache_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
            _jax.config.update("jax_compilation_cache_dir", str(path))
            # Cache every program, the tiny per-op programs of eager mode too: a sweep compiles thousands
            # of them, and loading one skips XLA's LLVM stage, most of its cost.
            min_s = float(os.environ.get("HF_TPU_CACHE_MIN_COMPILE_S", "0"))
            _jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)
            _jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        except OSError:  # an unwritable cache directory costs speed, not correctness
            pass
    from hf_tpu import counters

    counters.install_cache_listener(_jax)  # compile_stats()["tiers"]["xla"], eager per-op programs included
    from hf_tpu import program_bound

    program_bound.install_listener(_jax)  # bounds the executables alive at once (vm.max_map_count)
    from hf_tpu import lapack_batches

    lapack_batches.install(_jax)  # batched LAPACK calls that cannot deadlock XLA:CPU's thread pool
    return _jax


def platform() -> str:
    """The JAX platform tpu tensors live on (cpu here; gpu or tpu where JAX has them)."""
    return jax().default_backend()
