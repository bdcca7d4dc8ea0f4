"""An AOTCompiledFunction to bytes and back, with what torch's own serializer leaves out.

- Globals: Dynamo's generated code refers to objects it installed in the compiled function's module globals,
  named after `id()`s of this process (`___module_collections_<id>_c0` for the `collections` module that
  ModelOutput returns use). They are recorded by module name or import path and resolved on load.
- Inlined sources: the code Dynamo traced (the model's forward, hf_tpu's patches) is recorded with a
  checksum per function; on load each is compared with the source as it is now, and a changed one makes
  the entry stale (a miss), since the saved graph no longer is what tracing it would give.
  The recorded whole-module contents (torch keeps them for debugging) are dropped: megabytes per entry.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

PAYLOAD_VERSION = 1


class StaleEntry(RuntimeError):
    """A saved graph that no longer matches the code (an inlined source changed)."""


def _ref_of(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if mod and qual and "<locals>" not in qual:
        try:
            obj: Any = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
            if obj is value:
                return ("attr", mod, qual)
        except (ImportError, AttributeError):
            pass
    return None


def _resolve(ref: tuple[str, ...]) -> Any:
    obj: Any = importlib.import_module(ref[1])
    if ref[0] == "attr":
        for part in ref[2].split("."):
            obj = getattr(obj, part)
    return obj


def dumps(compiled: Any, fn_globals: dict[str, Any]) -> bytes:
    """Serialize an AOTCompiledFunction made from a function whose globals are `fn_globals`.
    Raises if something it needs cannot be recorded."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    art = compiled._artifacts
    env = art.runtime_env
    refs: dict[str, tuple[str, ...]] = {}
    for name in env.external_refs:
        if name in env.import_sources or name in env.used_globals or name == art.backend_id:
            continue
        if name not in fn_globals:
            continue  # a builtin
        ref = _ref_of(fn_globals[name])
        if ref is None:
            raise TypeError(f"global {name!r} of the compiled code cannot be recorded")
        refs[name] = ref
    # drop the whole-module copies of inlined sources (kept by torch for debugging only)
    slim = type(art.source_info)(inlined_sources={dataclasses.replace(s, content="")
                                                  for s in art.source_info.inlined_sources})
    original = art.source_info
    art.source_info = slim
    try:
        data = AOTCompiledFunction.serialize(compiled).serialized_data
    finally:
        art.source_info = original
    sources = [(s.module, s.firstlineno, s.lastlineno, s.checksum) for s in original.inlined_sources]
    return pickle.dumps({"version": PAYLOAD_VERSION, "refs": refs, "sources": sources, "artifact": data})


def check_sources(sources: list[tuple[str, int, int, str]]) -> None:
    from torch._dynamo.package import _hash_sourcelines

    for module, first, last, checksum in sources:
        try:
            current = _hash_sourcelines(importlib.import_module(module), first, last)
        except Exception as exc:  # noqa: BLE001 - a module that moved or cannot be read: stale
            raise StaleEntry(f"{module} cannot be read ({type(exc).__name__})") from None
        if current != checksum:
            raise StaleEntry(f"{module} lines {first}-{last} changed since the graph was saved")


def loads(payload: bytes, fn_globals: dict[str, Any]) -> Any:
    """The AOTCompiledFunction saved in `payload`, its graphs lowered by today's backend. Raises StaleEntry
    when the traced code changed, anything else when the payload is unusable."""
    import torch
    from torch._dynamo import convert_frame, package
    from torch._dynamo.aot_compile import AOTCompiledFunction
    from torch._dynamo.utils import get_metrics_context
    from torch._guards import CompileContext, TracingContext, compile_context, tracing

    state = pickle.loads(payload)
    if state.get("version") != PAYLOAD_VERSION:
        raise StaleEntry(f"payload version {state.get('version')} (expected {PAYLOAD_VERSION})")
    check_sources(state["sources"])
    f_globals = dict(fn_globals)
    f_globals.update({name: _resolve(ref) for name, ref in state["refs"].items()})
    # a tracing context too: unpickling an ImportSource in the saved guards installs a guard, which needs
    # one ("TracingContext.get() must be called within an ongoing trace": Zamba's graph never loaded)
    with compile_context(CompileContext(convert_frame.get_compile_id({}))), get_metrics_context(), \
            tracing(TracingContext(None)), torch._functorch.config.patch(bundled_autograd_cache=True), \
            mock.patch.object(package, "load_guards_state", _any_thread_count(package.load_guards_state)):
        return AOTCompiledFunction.deserialize(state["artifact"], f_globals=f_globals)


def _any_thread_count(load: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """torch._dynamo.package.load_guards_state, with the saved global-state guard's thread count made this
    process's. Dynamo guards torch.get_num_threads() (Inductor's C++ code is built for it); the tpu backend's
    graph and program do not depend on it, and it is not in the key: a graph saved by a process with another
    thread count (a `--jobs 1` sweep's workers have 2, `--jobs 2`'s have 1, pytest's the core count) was a
    guard miss ("GLOBAL_STATE changed: num_threads"), compiled again (BartForCausalLM's train step: ~10
    CPU-s) and saved over the entry, so processes of both kinds missed by turns. The other global state
    (grad mode, autocast, default dtype, deterministic algorithms) stays guarded."""
    import json

    import torch

    def loaded(guards_state: bytes) -> Any:
        state = load(guards_state)
        saved = getattr(getattr(state, "output_graph", None), "global_state_guard", None)
        if saved is not None:
            fields = json.loads(saved.__getstate__())
            if "num_threads" in fields:
                fields["num_threads"] = torch.get_num_threads()
                guard = type(saved).__new__(type(saved))
                guard.__setstate__(json.dumps(fields))
                state.output_graph.global_state_guard = guard
        return state

    return loaded
