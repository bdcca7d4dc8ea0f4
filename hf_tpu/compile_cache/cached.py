"""`torch.compile(..., backend="tpu")` with the three-tier graph cache in front of Dynamo.

The first call with given arguments computes the cache key (keys.py) and looks in memory, then on the
host, then in the shared tier. A hit is a saved AOTCompiledFunction whose guards are checked against the
call (a miss if they fail); it skips Dynamo and AOTAutograd, and its ATen graphs are lowered by today's
backend. On a miss the call is compiled ahead of time (full graph, serializable backend) and saved. When
that cannot be done (a graph break, an unsaveable global or guard) the call takes the ordinary
`torch.compile` path instead, with no error, and a negative entry makes later processes go there directly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from hf_tpu.compile_cache import artifact, keys, store

log = logging.getLogger(__name__)
_memory: dict[str, Any] = {}  # key -> AOTCompiledFunction (the per-process tier)
_unsaveable: dict[str, str] = {}  # key -> why it takes the ordinary path (this process)
_ran: set[int] = set()  # id() of the entries whose program has been lowered and run once


def _trace_errors() -> tuple[type[BaseException], ...]:
    """JAX's errors for a value a traced program needs concretely (op_jit meets the same in eager)."""
    from hf_tpu import op_jit

    return op_jit.tracer_errors()


def enabled() -> bool:
    return os.environ.get("HF_TPU_COMPILE_CACHE", "1") != "0"


def _call_module(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """What is compiled for `torch.compile(module)`: a plain module-level function taking the module as its
    first argument (a module's own decorated `forward`, as in Transformers, does not pickle)."""
    return module(*args, **kwargs)


_ORDINARY = object()  # "this call takes the ordinary torch.compile path"

# A TorchFunctionMode whose attribute of this name is true declares that it changes only random draws (the ops
# tagged nondeterministic_seeded: torch.randn, Tensor.normal_, F.dropout in training, ...) and passes every
# other call through unchanged, as the sweep's shared_draws (harness/sweep/draws.py) does. Under such modes
# (and no other) the cache still serves graphs that draw nothing; those entries have keys of their own.
DRAWS_ONLY = "hf_tpu_draws_only"


class RandomDraws(Exception):
    """A graph compiled under a draws-only mode draws random numbers itself: not for the cache."""


def draws_only_modes() -> bool:
    """Every active torch-function mode declares DRAWS_ONLY (and at least one is active)."""
    from torch.overrides import _get_current_function_mode_stack

    modes = _get_current_function_mode_stack()
    return bool(modes) and all(getattr(m, DRAWS_ONLY, False) is True for m in modes)


@contextlib.contextmanager
def _modes_set_aside() -> Iterator[None]:
    """The torch-function mode stack emptied for the block, and put back as it was."""
    from torch.overrides import _pop_mode, _push_mode

    popped = []
    while torch._C._len_torch_function_stack() > 0:
        popped.append(_pop_mode())
    try:
        yield
    finally:
        for mode in reversed(popped):
            _push_mode(mode)


def _modules(full: tuple[Any, ...]) -> list[Any]:
    return [a for a in full if isinstance(a, torch.nn.Module)]


def _signature(full: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Cheap summary of a call's tensors (shapes, dtypes) and simple values, for the steady-state path."""
    from torch.utils import _pytree as pytree

    out: list[Any] = []
    for leaf in pytree.tree_leaves((full, kwargs)):
        if isinstance(leaf, torch.Tensor):
            out.append((tuple(leaf.shape), leaf.dtype, leaf.device.type, leaf.storage_offset()))
        elif leaf is None or isinstance(leaf, bool | int | float | str):
            out.append(leaf)
        else:
            out.append(type(leaf))
    return tuple(out)


def _marked_dynamic(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    from torch.utils import _pytree as pytree

    return any(isinstance(leaf, torch.Tensor) and getattr(leaf, "_dynamo_dynamic_indices", None)
               for leaf in pytree.tree_leaves((args, kwargs)))


class CachedCall:
    """Calls `fn(*prefix, *args, **kwargs)` through the graph cache; `fallback(*args, **kwargs)` is the
    ordinary compiled callable."""

    def __init__(self, fn: Any, fallback: Any, prefix: tuple[Any, ...] = ()) -> None:
        self.fn = fn
        self.fallback = fallback
        self.prefix = prefix
        # the last entry used, with weak references to the modules it was used with: while the same modules
        # come back, the guards alone decide (no key is computed on the steady-state path)
        self._last: tuple[list[weakref.ref], tuple[Any, ...], Any] | None = None
        self._keys: dict[int, str] = {}  # id(compiled) -> its cache key, for a first call that cannot be lowered

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # inside an outer compile: let Dynamo trace the ordinary callable
            return self.fallback(*args, **kwargs)
        draws_only = False
        if torch._C._is_torch_function_mode_enabled():
            if not draws_only_modes():
                # A torch-function mode is active, e.g. the DeviceContext that torch.set_default_device leaves
                # on the stack even when set back to cpu. The mode is neither in the key nor in the saved guards,
                # and the ahead-of-time compile under it gave GPT-2's static-cache decode step a graph
                # specialised to other cache shapes (Transformers' test_generate_with_static_cache after
                # test_can_load_with_global_device_set). The ordinary torch.compile path handles modes.
                return self.fallback(*args, **kwargs)
            draws_only = True
        if _marked_dynamic(args, kwargs):
            # torch._dynamo.mark_dynamic: bounded dynamism (hf_tpu/bounded.py) on the ordinary path; as in
            # TorchTPU, graphs with dynamic sizes are not serialized
            return self.fallback(*args, **kwargs)
        # Modes that only replace random draws (DRAWS_ONLY) are set aside while a saved graph is looked up,
        # compiled and run: a graph that draws nothing computes under them what it computes without them, and
        # one that draws is refused (_compile), so the mode still serves its draws on the ordinary path.
        with _modes_set_aside() if draws_only else contextlib.nullcontext():
            out = self._cached(args, kwargs, draws_only)
        if out is _ORDINARY:
            return self.fallback(*args, **kwargs)
        return out

    def _cached(self, args: tuple[Any, ...], kwargs: dict[str, Any], draws_only: bool) -> Any:
        """The call's result through the cache, or _ORDINARY when it takes the ordinary compile path."""
        full = self.prefix + args
        sig = (draws_only, *_signature(full, kwargs))
        compiled = self._fast(full, kwargs, sig)
        if compiled is None:
            compiled = self._lookup(full, kwargs, draws_only)
            self._last = ([weakref.ref(m) for m in _modules(full)], sig, compiled)
        if compiled is _ORDINARY:
            return _ORDINARY
        if id(compiled) in _ran:
            return compiled.fn(*full, **kwargs)
        try:
            out = compiled.fn(*full, **kwargs)
        except _trace_errors() as exc:
            # The full-graph capture keeps in its graph what ordinary Dynamo splits at (`.item()` values): when
            # XLA cannot trace that, the call takes the ordinary path, which torch.compile users would have got
            # without the cache. Tracing fails before the program runs, so no input was touched.
            key = self._keys.get(id(compiled))
            reason = f"{type(exc).__name__} while lowering the saved graph"
            log.info("hf_tpu compile cache: %s takes the ordinary compile path (%s)", key, reason)
            if key is not None:
                _unsaveable[key] = reason
                _memory.pop(key, None)
                for _, root in store.disk_tiers():
                    store.mark_unsaveable(root, key, reason)
            store.bump("", "unsaveable")
            self._last = ([weakref.ref(m) for m in _modules(full)], sig, _ORDINARY)
            return _ORDINARY
        _ran.add(id(compiled))
        return out

    def _fast(self, full: tuple[Any, ...], kwargs: dict[str, Any], sig: tuple[Any, ...]) -> Any:
        if self._last is None:
            return None
        refs, last_sig, compiled = self._last
        mods = _modules(full)
        if len(mods) != len(refs) or any(r() is not m for r, m in zip(refs, mods, strict=True)):
            return None
        if compiled is _ORDINARY:  # same modules and argument shapes as a call that took the ordinary path
            return compiled if sig == last_sig else None
        if sig[0] != last_sig[0]:  # with a draws-only mode or without: entries of different keys
            return None
        if compiled.guard_check(*full, **kwargs):
            store.bump("memory", "hits")
            return compiled
        return None

    def _lookup(self, full: tuple[Any, ...], kwargs: dict[str, Any], draws_only: bool = False) -> Any:
        try:
            key, _ = keys.call_key(self.fn, full, kwargs, modes=DRAWS_ONLY if draws_only else "")
        except Exception as exc:  # noqa: BLE001 - no key, no cache: the ordinary path
            log.debug("hf_tpu compile cache: no key (%s)", exc)
            return _ORDINARY
        if key in _unsaveable:
            return _ORDINARY
        compiled = _memory.get(key)
        if compiled is not None:
            if compiled.guard_check(*full, **kwargs):
                store.bump("memory", "hits")
                self._keys[id(compiled)] = key
                return compiled
            store.bump("", "guard_misses")
        store.bump("memory", "misses")
        fn_globals = getattr(self.fn, "__globals__", {})
        for tier, root in store.disk_tiers():
            if store.is_unsaveable(root, key):
                _unsaveable[key] = "marked unsaveable"
                store.bump(tier, "hits")
                return _ORDINARY
            payload = store.read(root, key)
            if payload is None:
                store.bump(tier, "misses")
                continue
            try:
                compiled = artifact.loads(payload, fn_globals)
            except artifact.StaleEntry as exc:
                log.info("hf_tpu compile cache: stale entry %s (%s)", key, exc)
                store.bump("", "stale")
                store.bump(tier, "misses")
                continue
            except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss, never an error
                log.debug("hf_tpu compile cache: cannot load %s", key, exc_info=True)
                store.warn_once(key, f"ignoring unreadable cache entry {key} in {root} "
                                     f"({type(exc).__name__}: {exc}); compiling instead")
                store.bump("", "corrupt")
                store.bump(tier, "misses")
                continue
            if not compiled.guard_check(*full, **kwargs):
                store.bump("", "guard_misses")
                store.bump(tier, "misses")
                continue
            store.bump(tier, "hits")
            if tier == "shared":
                store.write(store.host_dir(), key, payload)
            _memory[key] = compiled
            self._keys[id(compiled)] = key
            return compiled
        return self._compile(key, full, kwargs, fn_globals, draws_only)

    def _compile(self, key: str, full: tuple[Any, ...], kwargs: dict[str, Any], fn_globals: dict[str, Any],
                 draws_only: bool = False) -> Any:
        from hf_tpu.compile_cache import serializable

        try:
            with serializable.recording_seeded_ops() as seeded:
                compiled = serializable.aot_compile(self.fn, full, kwargs)
            if draws_only and seeded:
                # compiled with the draws-only mode set aside, the graph draws from the backend's generator:
                # the mode must serve those draws, so the call goes the ordinary way, the mode active
                raise RandomDraws(f"the graph draws random numbers ({', '.join(sorted(set(seeded))[:4])}) "
                                  f"that a {DRAWS_ONLY} mode replaces")
        except Exception as exc:  # noqa: BLE001 - graph break, unsaveable guard: the ordinary path
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.info("hf_tpu compile cache: %s takes the ordinary compile path (%s)", key, reason)
            _unsaveable[key] = reason
            store.bump("", "unsaveable")
            for _, root in store.disk_tiers():
                store.mark_unsaveable(root, key, reason)
            return _ORDINARY
        _memory[key] = compiled
        self._keys[id(compiled)] = key
        try:
            payload = artifact.dumps(compiled, fn_globals)
        except Exception as exc:  # noqa: BLE001 - usable in this process, just not saved
            log.info("hf_tpu compile cache: %s compiled but not saved (%s: %s)", key, type(exc).__name__, exc)
            store.bump("", "unsaveable")
            return compiled
        for _, root in store.disk_tiers():
            if store.write(root, key, payload):
                store.bump("", "saved")
        return compiled


_reset_hooked = False


def _hook_dynamo_reset() -> None:
    """torch._dynamo.reset() forgets every compiled graph of the process: the memory tier too (the disk
    tiers stay, as torch's own on-disk caches do)."""
    global _reset_hooked
    import torch._dynamo

    if _reset_hooked:
        return
    original = torch._dynamo.reset

    @functools.wraps(original)
    def reset() -> None:
        original()
        _memory.clear()
        _unsaveable.clear()
        _ran.clear()

    torch._dynamo.reset = reset
    _reset_hooked = True


def wrap(model: Any, compiled: Any) -> Any:
    """Put the cache in front of `compiled` (what torch.compile returned for `model`)."""
    from hf_tpu import bounded_frames

    _hook_dynamo_reset()
    # as hf_tpu.compile.tpu_backend does on first use (a cache hit never reaches the backend, and
    # aot_compile_fullgraph restores the flag it ran under)
    bounded_frames.static_shapes_by_default()
    if isinstance(model, torch.nn.Module) and isinstance(compiled, torch.nn.Module):
        fallback = compiled.forward
        # OptimizedModule calls self.forward from Module.__call__; the cache replaces it, and passes the
        # original module (not the OptimizedModule) to the compiled wrapper
        compiled.forward = CachedCall(_call_module, fallback, prefix=(model,))
        return compiled
    if inspect.ismethod(model):  # e.g. Transformers' `torch.compile(self.__call__)`: the function, self first
        call = CachedCall(model.__func__, compiled, prefix=(model.__self__,))
        return functools.wraps(model)(lambda *a, **k: call(*a, **k))
    if inspect.isfunction(model):
        call = CachedCall(model, compiled)
        return functools.wraps(model)(lambda *a, **k: call(*a, **k))
    return compiled
