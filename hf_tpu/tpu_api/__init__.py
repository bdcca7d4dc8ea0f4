"""`torch.tpu` and its submodules, built from the declarative table in `table.py` (as torch_tpu builds its
own from `_PUBLIC_MODULES`). Attributes resolve lazily on first access, so `import torch` imports none of
the implementation modules (and no JAX)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from hf_tpu.tpu_api.errors import needs_hardware
from hf_tpu.tpu_api.legacy import guard
from hf_tpu.tpu_api.table import EXTRAS, TABLE, Export


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(f"hf_tpu.tpu_api.{module}")
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class _ApiModule(types.ModuleType):
    """A module whose exports resolve on first access."""

    _exports: dict[str, Export]
    _extras: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        exp = self._exports.get(name)
        if exp is not None:
            val = needs_hardware(f"{self.__name__}.{name}") if exp.hardware_only else _resolve(exp.target)
            if self.__name__ == "torch.tpu":
                val = guard(name, val)
        elif name in self._extras:
            val = _resolve(self._extras[name])
        else:
            raise AttributeError(f"module '{self.__name__}' has no attribute '{name}'")
        setattr(self, name, val)
        return val

    def __dir__(self) -> list[str]:
        return sorted(set(self.__all__) | set(self._extras))


def _module(name: str, exports: dict[str, Export], children: list[str], extras: dict[str, str]) -> _ApiModule:
    props = {}
    for n, exp in exports.items():
        if exp.prop and not exp.hardware_only:
            props[n] = _lazy_property(exp.target)
        elif exp.prop:
            props[n] = property(lambda self, _n=f"{name}.{n}": needs_hardware(_n)())
    cls = type(f"_{name.replace('.', '_')}_module", (_ApiModule,), props) if props else _ApiModule
    mod = cls(name, f"hf-tpu's `{name}` (torch_tpu 0.2.0's public names; table in hf_tpu/tpu_api/table.py).")
    mod._exports = {n: e for n, e in exports.items() if not e.prop}
    mod._extras = dict(extras)
    mod.__all__ = sorted([*exports, *children])
    mod.__tt_api_stages__ = {n: "experimental" for n, e in exports.items() if e.experimental}
    return mod


def _lazy_property(target: str) -> property:
    # The target is a (getter, setter) pair of functions: resolved when the property is first read or set.
    def fget(self: Any) -> Any:
        return _resolve(target)[0]()

    def fset(self: Any, value: Any) -> None:
        setter = _resolve(target)[1]
        if setter is None:
            raise AttributeError(f"{target.split(':')[1]} is read-only")
        setter(value)

    return property(fget, fset)


def build() -> _ApiModule:
    """Create `torch.tpu` and its submodules from TABLE and register them in sys.modules."""
    mods: dict[str, _ApiModule] = {}
    for name in sorted(TABLE, key=lambda n: n.count(".")):
        children = [c.rpartition(".")[2] for c in TABLE if c.rpartition(".")[0] == name]
        mods[name] = _module(name, dict(TABLE[name]), children, EXTRAS if name == "torch.tpu" else {})
    for name, mod in mods.items():
        parent, _, leaf = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], leaf, mod)
            sys.modules[name] = mod
    return mods["torch.tpu"]
