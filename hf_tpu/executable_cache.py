"""Compiled XLA executables shared across processes, looked up before anything is traced.

JAX's persistent compilation cache (runtime.py) is keyed by the lowered module: a new process still traces
each program's Python (an eager op's lowering, a whole graph's) and lowers it to StableHLO before it can ask
the cache, and a sweep worker pays that again for every op program it meets (~12 ms of CPU per small
program warm, against ~4 ms to load a serialized executable; measured with jax 0.10.2 on this machine).
Here a program is named before it is traced: the caller gives an `ident`, a string that determines the
traced function completely (eager ops: the op, its static arguments, the precision and default dtype), and
each call's executable is stored under an ident key (executable_keys.py) made of the ident, the compile
variant (fast compile or XLA's full optimisation, xla_options.py) and its compiler options, the call's
abstract arguments (shape, dtype, weak type, devices) and the environment: versions, backend and devices,
JAX's trace-affecting configuration, XLA_FLAGS and hf-tpu's variables, and a digest of every hf_tpu source
file (a lowering calls helpers anywhere in the package).

A hit deserializes the executable (jax.experimental.serialize_executable) and runs it: no tracing, no
lowering. On a miss the program is traced and lowered, and then looked up again by its lowered key
(executable_keys.py: the lowered program, what JAX keeps beside it, the same variant, options and arguments,
the environment without the sources): any commit to hf_tpu misses every ident key, and this second lookup
serves every program whose lowering the commit left unchanged without an XLA compile, and names the entry
by the new ident key too (a hard link: no second copy on disk), so the next process skips the tracing as well.
Only when both miss is the program compiled, with JAX's persistent cache off for that one
compile (an executable JAX loaded from its own cache serializes without its kernels: calling it after
deserializing failed with "Function ..._kernel not found"), and saved under both keys (one file). Entries are
written atomically (a temporary file renamed), with a checksum; an entry that cannot be read, fails its
checksum or fails to deserialize is skipped with a warning (a miss), and overwritten by the next save.

Only callers that can vouch for their ident use it, and only for idents made of stable values (`stable()`):
op_jit's programs when the lowering table is the package's own (eager_functional: not under
hooks.override_lowerings, whose replaced lowerings are not named by the ident); compiled graphs
(graph_ident.py: a canonical text of the graph, the same for the graph Dynamo made and the one loaded from
the graph cache); the fused optimizer's chunk programs (optim_lowerings: lists of arrays and keyword
hyperparameters, Python numbers among them, and donated arguments, whose donation is compiled into the
executable and named in the ident). A program that cannot be saved (it calls a custom-call target other than hf-tpu's own,
register_targets, or has hoisted constants) is compiled with JAX's cache on, so its miss costs what it did before. HF_TPU_EXECUTABLE_CACHE=0
turns it off; HF_TPU_DISABLE_DISK_CACHE=1 (no persistent cache at all) does too. Entries live in
`executables/` under runtime.cache_dir() (JAX ignores subdirectories of its cache), those of the lowered keys
in `executables/lowered/` (hard links to them under the ident keys: a copy of the directory that does not keep
hard links, as shutil.copytree, holds two copies of each, still correct).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hf_tpu import cache_entries, counters, program_bound, runtime
from hf_tpu.executable_keys import (  # noqa: F401 - stable and Unstable: the callers' names for them
    _SCALARS, FORMAT, Unstable, entry_key, lowered_entry_key, stable)
MAGIC = b"hf_tpu-executable-v1\n"
_lock = threading.Lock()
_stats = {"hits": 0, "lowered_hits": 0, "misses": 0, "saved": 0, "unsaveable": 0, "corrupt": 0}
_warned: set[str] = set()
_programs: weakref.WeakSet[Program] = weakref.WeakSet()


def enabled() -> bool:
    return (os.environ.get("HF_TPU_EXECUTABLE_CACHE", "1") != "0"
            and os.environ.get("HF_TPU_DISABLE_DISK_CACHE") != "1")


def directory() -> Path:
    return runtime.cache_dir() / "executables"


def stats() -> dict[str, int]:
    """Each first call of a program signature is one of: `hits` (served by its ident: nothing traced),
    `lowered_hits` (traced and lowered, served by the lowered program's key: no XLA compile) or `misses`
    (compiled; `unsaveable` of them not saved). `saved`: entries written; `corrupt`: entries skipped."""
    with _lock:
        return dict(_stats)


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = 0


def _bump(what: str) -> None:
    with _lock:
        _stats[what] += 1


# ----------------------------------------------------------------------------------------------- custom calls
# Custom-call targets of hf-tpu's own that a saved executable may call: name -> a function that registers the
# target with XLA in this process (True when it could). Registered by the module that lowers to them
# (torch_dot_ffi) when imported, which happens before any executable is loaded (lowering.py imports it).
_targets: dict[str, Callable[[], bool]] = {}


def register_targets(names: tuple[str, ...] | list[str], ensure: Callable[[], bool]) -> None:
    """Programs calling only these custom-call targets may be saved: `ensure()` registers them before an entry
    that records them is loaded (an unregistered target killed the process: _custom_calls)."""
    for name in names:
        _targets[name] = ensure


# ----------------------------------------------------------------------------------------------- store
def _path(key: str) -> Path:
    if key.startswith("L"):  # the lowered keys (lowered_entry_key), a directory of their own
        return directory() / "lowered" / key[1:3] / f"{key}.exe"
    return directory() / key[:2] / f"{key}.exe"


def _warn(where: str, message: str) -> None:
    if where in _warned:
        return
    _warned.add(where)
    warnings.warn(f"hf_tpu executable cache: {message}", RuntimeWarning, stacklevel=4)


def read(key: str) -> bytes | None:
    """The payload saved under `key`, or None (absent; unreadable or corrupt: then with a warning)."""
    payload, corrupt = cache_entries.read(_path(key), MAGIC, _warn)
    if corrupt:
        _bump("corrupt")
    return payload


def write(key: str, payload: bytes) -> bool:
    return cache_entries.write(_path(key), MAGIC, payload, _warn)


# ----------------------------------------------------------------------------------------------- programs
def _release_all() -> None:
    for p in list(_programs):
        p._exes.clear()


program_bound.on_release.append(_release_all)  # the bound drops every executable: ours too


class Program:
    """Calls `variants[name](*args, **kwargs)` through the shared cache. `choose(args)` names the variant of a
    call (xla_options' size rule); `program.fast(...)` / `program.full(...)` call one variant. Positional
    arrays take the quick path (an eager op's program); pytrees of arrays and Python numbers, positional or
    keyword (the fused optimizer's parameter lists and hyperparameters), a slower one. Calls with anything
    else (tracers: a program traced inside another) go to the fast variant's jitted function itself."""

    def __init__(self, ident: str, variants: dict[str, tuple[Any, Any]], choose: Callable[[tuple], str]) -> None:
        self.ident = ident
        self.variants = variants  # name -> (jitted function, its compiler options)
        self.choose = choose
        self._exes: dict[tuple, Any] = {}
        self._array_type = _array_type()
        _programs.add(self)

    def _cache_size(self) -> int:
        return sum(j._cache_size() for j, _ in self.variants.values()) + len(self._exes)

    def executables(self) -> int:
        """Executables this process holds for the program (one per call signature: loaded or compiled)."""
        return len(self._exes)

    def __getattr__(self, name: str) -> Any:
        # `.fast` / `.full`, as on xla_options.jit's routed programs: the variant, counting its executables
        variants = self.__dict__.get("variants", {})
        if name in variants:
            return _Variant(self, name)
        raise AttributeError(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        counters.program_ran()  # xla_options.jit's programs count their calls (counters.py)
        array = self._array_type
        if kwargs or any(type(a) is not array for a in args):
            return self._call_tree(self.choose(args), args, kwargs)
        return self._call(self.choose(args), args)

    def _call(self, variant: str, args: tuple) -> Any:
        # JAX's default device places what a program makes from no input (factories): tpu:1's `ones` is
        # not tpu:0's, so it is part of the signature (dispatch sets it for every device but 0)
        place = runtime.jax().config.jax_default_device
        sig = (variant, place, *[(a.aval, a.sharding) for a in args])
        exe = self._exes.get(sig)
        if exe is not None:
            return exe(*args)
        return self._first_call(sig, variant, args, {}, args, place, None)

    def _call_tree(self, variant: str, args: tuple, kwargs: dict) -> Any:
        jax = runtime.jax()
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        array = self._array_type
        sig_leaves = []
        for a in leaves:
            if type(a) is array:
                sig_leaves.append((a.aval, a.sharding))
            elif type(a) in _SCALARS:
                sig_leaves.append(type(a))
            else:  # a tracer (traced inside another program: JAX takes compile options only at the top, so
                # the fast variant, xla_options._large) or something no executable takes
                return self.variants.get("fast", self.variants[variant])[0](*args, **kwargs)
        place = jax.config.jax_default_device
        sig = (variant, place, tree, *sig_leaves)
        exe = self._exes.get(sig)
        if exe is not None:
            return exe(*args, **kwargs)
        return self._first_call(sig, variant, args, kwargs, leaves, place, tree)

    def _first_call(self, sig: tuple, variant: str, args: tuple, kwargs: dict, leaves: tuple | list, place: Any,
                    tree: Any) -> Any:
        jitted, options = self.variants[variant]
        key = entry_key(self.ident, variant, options, leaves, place, tree)
        loaded = _load(key, leaves, ident=self.ident)
        if loaded is not None and (out := _run_loaded(loaded[0], key, args, kwargs, leaves)) is not _UNUSABLE:
            _bump("hits")
            self._exes[sig] = loaded[0]
            return out
        _listen()
        lowered = jitted.lower(*args, **kwargs)  # traced with JAX's cache on: eager computations inside a trace use it
        targets = _saveable(lowered)
        lkey = None if targets is None else lowered_entry_key(lowered, variant, options, leaves, place, tree)
        loaded = None if lkey is None else _load(lkey, leaves, lowered=lkey)
        if loaded is not None and (out := _run_loaded(loaded[0], lkey, args, kwargs, leaves)) is not _UNUSABLE:
            # the same lowered program, compiled by another process (another hf_tpu, another ident): no XLA
            # compile; named by this ident too, so that the next process skips the tracing as well
            _bump("lowered_hits")
            _share(lkey, key, self.ident, loaded[1])
            self._exes[sig] = loaded[0]
            return out
        _bump("misses")
        exe = self._exes[sig] = _compile_and_save(key, lkey, self.ident, lowered, targets)
        return exe(*args, **kwargs)


_UNUSABLE = object()


def _run_loaded(exe: Any, key: str, args: tuple, kwargs: dict, leaves: tuple | list) -> Any:
    """`exe(*args, **kwargs)`, or _UNUSABLE when a loaded executable fails (a saved executable can fail only
    now: a kernel missing from it); a real error raises again when the program is compiled."""
    try:
        return exe(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - unusable: a miss
        if _consumed(leaves):  # a donated input is gone: nothing can be retried
            raise
        _unusable(key, exc)
        return _UNUSABLE


def _consumed(leaves: tuple | list) -> bool:
    return any(getattr(a, "is_deleted", lambda: False)() for a in leaves)


@functools.cache
def _array_type() -> type:
    """JAX's concrete array type (not jax.Array, which tracers pass for; nor the type of an array made here,
    which is a tracer when the first call comes inside another program's trace)."""
    runtime.jax()
    from jax._src.array import ArrayImpl

    return ArrayImpl


class _Variant:
    """One variant of a Program: callable as its jitted function, `_cache_size()` counting the executables it
    has in this process, the cache's and JAX's."""

    def __init__(self, program: Program, name: str) -> None:
        self.program, self.name = program, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        counters.program_ran()
        program = self.program
        if kwargs or any(type(a) is not program._array_type for a in args):
            return program._call_tree(self.name, args, kwargs)
        return program._call(self.name, args)

    def _cache_size(self) -> int:
        return self.program.variants[self.name][0]._cache_size() + sum(
            1 for sig in list(self.program._exes) if sig[0] == self.name)


def _unusable(key: str, exc: BaseException) -> None:
    _warn(key, f"ignoring unusable entry {_path(key)} ({type(exc).__name__}: {str(exc)[:200]}); compiling instead")
    _bump("corrupt")


def _load(key: str, leaves: tuple | list, *, ident: str | None = None,
          lowered: str | None = None) -> tuple[Any, dict] | None:
    """(executable, entry) saved under `key` (found by the program's ident, or by its lowered key), or None
    (absent or unusable: then with a warning)."""
    from jax.experimental import serialize_executable as se

    payload = read(key)
    if payload is None:
        return None
    try:
        state = pickle.loads(payload)
        if state.get("format") != FORMAT or (
                state.get("ident") != ident if lowered is None else state.get("lowered") != lowered):
            raise ValueError("the entry names another program")
        for target in state.get("targets", ()):  # hf-tpu's own custom calls: registered before loading
            ensure = _targets.get(target)
            if ensure is None or not ensure():
                raise ValueError(f"the entry calls custom-call target {target}, which cannot be registered here")
        exe = se.deserialize_and_load(state["exe"], state["in_tree"], state["out_tree"])
        takes = runtime.jax().tree_util.tree_leaves(exe.in_avals)
        if len(takes) != len(leaves) or any(
                type(a) not in _SCALARS and (tuple(i.shape), i.dtype) != (a.shape, a.dtype)
                for i, a in zip(takes, leaves, strict=True)):
            raise ValueError("the entry's executable takes other arguments")
    except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss, never an error
        _unusable(key, exc)
        return None
    program_bound.note_executable()  # mapped like any other executable
    return exe, state


def _share(lkey: str, key: str, ident: str, state: dict) -> None:
    """Names the entry found under the lowered key `lkey` by the ident key `key` too: the same file (a hard
    link: every program of a new hf_tpu gets a new ident key, and copies would double the directory) when it
    records this ident, else a copy recording it (the executable's bytes as they were: an executable once
    deserialized is not serialized again, _without_jax_cache)."""
    if state.get("ident") == ident and cache_entries.link(_path(lkey), _path(key)):
        return
    write(key, pickle.dumps({**state, "ident": ident}))


@contextlib.contextmanager
def _without_jax_cache() -> Iterator[bool]:
    """JAX's persistent cache unused within the block (yields whether that could be arranged). An executable
    JAX loaded from its cache serializes without its kernels (calling it after deserializing failed with
    "Function ..._kernel not found"), so what is saved here is compiled afresh. JAX reads its
    `enable_compilation_cache` setting once per process, so the module's memo is what is switched; another
    thread compiling meanwhile merely misses JAX's cache too."""
    from jax._src import compilation_cache as cc

    jax = runtime.jax()
    if not hasattr(cc, "_cache_used") or not hasattr(cc, "is_cache_used"):
        yield False
        return
    cc.is_cache_used(jax.devices()[0].client)  # initialised first, so the switch below is not undone
    with _switch_lock:
        before = cc._cache_used
        cc._cache_used = False
        try:
            yield True
        finally:
            cc._cache_used = before


_switch_lock = threading.RLock()  # re-entered if a trace ever compiles another program concretely
_jax_cache_hits = [0]  # JAX's persistent-cache hits so far (a listener counts them)


def _count_jax_hits(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _jax_cache_hits[0] += 1


def _saveable(lowered: Any) -> set[str] | None:
    """The custom-call targets of a program that may be saved, or None when it may not (_custom_calls; JAX
    cannot serialize a program with hoisted constants either)."""
    targets = _custom_calls(lowered)
    if targets is None or set(targets) - set(_targets) or getattr(getattr(lowered, "_lowering", None), "const_args", None):
        return None
    return targets


def _compile_and_save(key: str, lkey: str | None, ident: str, lowered: Any, targets: set[str] | None) -> Any:
    """Compiles `lowered` and saves the executable under the lowered key `lkey` (when the program has one) and
    under its ident key `key` (the same file)."""
    from jax.experimental import serialize_executable as se

    if targets is None:
        # not saveable: compiled with JAX's own cache, so that this miss, repeated in every process, costs no
        # more than it did before
        _bump("unsaveable")
        return lowered.compile()
    with _without_jax_cache() as fresh:
        hits = _jax_cache_hits[0]
        exe = lowered.compile()
        if not fresh or _jax_cache_hits[0] != hits:  # possibly JAX's cached copy: usable, not saveable
            _bump("unsaveable")
            return exe
    try:
        blob, in_tree, out_tree = se.serialize(exe)
        state = {"format": FORMAT, "ident": ident, "lowered": lkey, "exe": blob, "in_tree": in_tree,
                 "out_tree": out_tree, "targets": sorted(targets)}
        data = pickle.dumps(state)
    except Exception:  # noqa: BLE001 - usable here, just not saved (an output pytree that does not pickle)
        _bump("unsaveable")
        return exe
    if lkey is not None and write(lkey, data):
        _share(lkey, key, ident, state)
        _bump("saved")
    elif write(key, data):
        _bump("saved")
    return exe


def _custom_calls(lowered: Any) -> set[str] | None:
    """The custom-call targets the program calls (None: cannot tell). jaxlib registers its own handlers
    (LAPACK's `lapack_sgetrf_ffi` and the other FFI kernels behind linear algebra) in a process only when it
    first lowers such a program, so an executable deserialized in a fresh process called an unregistered
    kernel and the process died (SIGSEGV: torch.linalg.det on tpu in a second process). Programs calling
    those are not saved (they trace and lower in each process as before); hf-tpu's own targets
    (register_targets) are registered before an entry recording them is loaded, so those programs are."""
    import re

    try:
        text = lowered.as_text()
    except Exception:  # noqa: BLE001 - cannot tell: do not save
        return None
    if "custom_call" not in text:
        return set()
    # StableHLO's `stablehlo.custom_call @target(...)`; anything else naming a custom call: unknown
    names = re.findall(r"custom_call @([\w.$-]+)", text)
    return set(names) if len(names) == text.count("custom_call") else None


@functools.cache
def _listen() -> None:
    runtime.jax().monitoring.register_event_listener(_count_jax_hits)
