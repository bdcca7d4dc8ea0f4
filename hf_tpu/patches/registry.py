"""What every patch shares: the registry of patch targets, the guard-replace-mark routine (`@patch`), and
the questions a patch asks before it changes behaviour (does hf_tpu serve `tpu`? is this device ours?).
Imports nothing of upstream: the import hook (hook.py) applies what is registered here when a target
module is imported."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

_applied: list[str] = []

# target module -> the functions that patch it, in registration order (one per replaced attribute)
TARGETS: dict[str, list[Callable[[Any], None]]] = {}
# patches of torch itself: applied by install() when hf_tpu serves `tpu` (torch is imported by then)
AT_INSTALL: list[Callable[[], None]] = []

_REGISTERED: list[tuple[str, str, str]] = []  # (patch name, module, attribute), in registration order
MARK = "_hf_tpu_patched"


def mark(name: str) -> None:
    if name not in _applied:
        _applied.append(name)


def applied_names() -> list[str]:
    return list(_applied)


def registered() -> list[tuple[str, str, str]]:
    """Every patch hf_tpu can apply: (name, target module, attribute replaced)."""
    return list(_REGISTERED)


def is_patched(obj: Any) -> bool:
    """The mark of a replacement (on a property: on its getter, as a property takes no attributes)."""
    return bool(getattr(obj, MARK, False) or getattr(getattr(obj, "fget", None), MARK, False))


def _set_mark(obj: Any) -> None:
    try:
        setattr(obj, MARK, True)
    except (AttributeError, TypeError):
        setattr(obj.fget, MARK, True)


def _owner(root: Any, path: str) -> tuple[Any, str]:
    *inner, leaf = path.split(".")
    for part in inner:
        root = getattr(root, part)
    return root, leaf


def patch(module: str, attr: str, name: str, *, at_install: bool = False, optional: bool = False,
          also_in: tuple[str, ...] = ()) -> Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]:
    """Register a patch: the decorated `make(orig, mod)` returns the replacement of `mod.<attr>` (`attr` may be
    a dotted path inside the module, e.g. "PartialState.default_device"), or None to leave it alone. Once
    applied, `mod.<attr>` is the replacement, which carries the mark (so it is never wrapped twice), and
    `name` is listed by applied(). `also_in`: modules that may have bound the original under any name before
    the patch (`from x import f`); such bindings get the replacement too. `optional`: an upstream version
    without `attr` is left alone silently (otherwise the hook warns that the patch could not be applied).
    `at_install`: a patch of torch,
    applied by install() when hf_tpu serves `tpu` rather than when `module` is imported."""

    def register(make: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def apply(mod: Any) -> None:
            try:
                owner, leaf = _owner(mod, attr)
                orig = getattr(owner, leaf)
            except AttributeError:
                if optional:
                    return
                raise
            if is_patched(orig):
                return
            new = make(orig, mod)
            if new is None:
                return
            _set_mark(new)
            setattr(owner, leaf, new)
            for other_name in also_in:
                other = sys.modules.get(other_name)
                for k, v in list(vars(other).items()) if other is not None else ():
                    if v is orig:
                        setattr(other, k, new)
            mark(name)

        apply.__name__ = apply.__qualname__ = make.__name__
        if at_install:
            AT_INSTALL.append(lambda: apply(importlib.import_module(module)))
        else:
            TARGETS.setdefault(module, []).append(apply)
        _REGISTERED.append((name, module, attr))
        return make

    return register


def tpu_served_by_hf_tpu() -> bool:
    from hf_tpu import device

    return device.is_registered()


def is_hf_tpu_device(device: Any) -> bool:
    if isinstance(device, str):
        kind = device.split(":")[0]
    else:
        kind = getattr(device, "type", None)
    return kind == "tpu" and tpu_served_by_hf_tpu()
