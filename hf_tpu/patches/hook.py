"""The import hook that applies the registered patches (registry.py) to a target module right after the
module's own code has run, or at once if it is already imported; `install()` puts it on sys.meta_path.
It must stay cheap (`import torch` runs it): it imports no target library itself."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from hf_tpu.patches.registry import AT_INSTALL, TARGETS, applied_names, tpu_served_by_hf_tpu

_installed = False
_busy: set[str] = set()
_pending: dict[str, Any] = {}  # target modules that were still running their own code when we met them


def applied() -> list[str]:
    """Names of the patches applied so far in this process."""
    apply_pending()
    return applied_names()


def _disabled() -> bool:
    return os.environ.get("HF_TPU_NO_PATCHES") == "1"


def _initializing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _apply(name: str, module: Any, ran: bool = False) -> None:
    """Patch `module` (`ran`: its code has just run, from the finder's exec_module) now, or, if its own code
    is still running (it imported torch, whose autoload imported us), remember it: a half-run module lacks
    the names we patch, and patching it raised inside `import torch`. `apply_pending()` finishes the job
    once the module has finished importing."""
    if sys.modules.get(name) is not module:
        _pending.pop(name, None)  # its import failed: nothing to patch
        return
    if not ran and _initializing(module):
        _pending[name] = module
        return
    _pending.pop(name, None)
    before = dict(vars(module))
    for patch in TARGETS[name]:
        try:
            patch(module)
        except Exception as exc:  # a patch must never break an import; upstream's behaviour stays
            import warnings

            warnings.warn(f"hf_tpu: could not apply {patch.__name__} to {name}: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
    changed = {k: (old, vars(module)[k]) for k, old in before.items() if vars(module).get(k, old) is not old}
    if changed:
        _rebind(changed)


def _rebind(changed: dict[str, tuple[Any, Any]]) -> None:
    """Modules that copied a patched name (`from x import f`) before the patch was applied get the patched
    one too. Only a late patch (see `_apply`) can find such copies; scanning sys.modules costs ~1 ms."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, (old, new) in changed.items():
            if d.get(k) is old:
                d[k] = new


def apply_pending() -> None:
    """Patch the target modules that have finished importing since we first met them half-run. Called
    on every later import (the finder below), on the first tpu op, and by `applied()`."""
    for name, module in list(_pending.items()):
        if not _initializing(module):
            _apply(name, module)


class _PatchingFinder:  # a meta path finder (duck-typed: importlib.abc costs ~15 ms at import torch)
    """Finds a target module with the other finders, and wraps its loader's `exec_module` so that the
    module is patched as soon as its code has run (before `from x import name` elsewhere copies names)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if _pending:
            apply_pending()
        if fullname not in TARGETS or fullname in _busy:
            return None
        _busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            _busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        orig_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            _apply(fullname, module, ran=True)

        loader.exec_module = exec_module  # this loader instance serves this one module
        return spec


def install() -> None:
    """Apply the patches (called when hf_tpu is imported, which `import torch` does). Cheap and idempotent."""
    global _installed
    if _installed or _disabled():
        return
    _installed = True
    from hf_tpu import device

    # a library imported before torch had finished importing is complete by the first tpu op
    device.on_first_op(apply_pending)
    sys.meta_path.insert(0, _PatchingFinder())
    for name in TARGETS:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    if tpu_served_by_hf_tpu():
        for apply in AT_INSTALL:
            apply()
