"""The zoo's two record types: `ZooEntry` (what can be built, cheap to list) and `BuiltEntry` (a model
with its inputs, ready to run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class ZooBuildError(RuntimeError):
    """An entry could not be built. `category` is one of `harness.zoo.errors.CATEGORIES` and `stage` names
    the build step that failed (config, init, inputs), so a check report can say why without parsing text."""

    def __init__(self, message: str, *, category: str = "other", stage: str = "build") -> None:
        super().__init__(message)
        self.category = category
        self.stage = stage


def call_kwargs(model: Any, inputs: dict[str, Any]) -> Any:
    """The default way to run an entry: `model(**inputs)`. A module-level function (not a lambda) so a
    BuiltEntry stays picklable and its `call` is obvious in tracebacks."""
    return model(**inputs)


@dataclass(frozen=True)
class ZooEntry:
    """One buildable model. Listing entries never instantiates a model; `build` does.

    `source` carries what the builder needs beyond the class name (for hub entries: the resolved config
    path); `hub_layers` caps the depth of real hub configs."""

    id: str
    library: str
    model_type: str
    model_class: str
    task: str
    available: bool = True
    reason: str = ""
    source: str = ""
    hub_layers: int = 2

    def build(self, seed: int = 0) -> BuiltEntry:
        """Instantiate the model (CPU, float32, eval mode, weights seeded by `seed`) and its inputs.
        Raises `ZooBuildError` (with a failure category) on failure."""
        if _builder is None:
            raise RuntimeError("harness.zoo has not finished importing: no builder for zoo entries yet")
        return _builder(self, seed)


# Building needs the libraries' builders (harness/zoo/builders.py), which sit above this module: they make
# BuiltEntry and raise ZooBuildError. The zoo package hands its dispatcher in when it is imported, which any
# import of this module does first; so the records stay importable without the builders.
_builder: Callable[[ZooEntry, int], BuiltEntry] | None = None


def set_builder(fn: Callable[[ZooEntry, int], BuiltEntry]) -> None:
    global _builder
    _builder = fn


@dataclass
class BuiltEntry:
    """A built model and its inputs, all on CPU.

    Run it as `entry.call(entry.model, entry.inputs)`. To run elsewhere, move the model with
    `model.to(device)` and tree-map the tensors in `inputs` with `.to(device)`; `call` keeps working.
    For pipelines (`library == "diffusers"`, task `pipeline`), `model` is the `DiffusionPipeline`: move it with
    `pipe.to(device)`; `inputs` holds only Python values, and `call` makes a fresh seeded `torch.Generator`
    on CPU for every call (diffusers draws the noise on CPU and moves it), so results are reproducible
    wherever the pipeline runs."""

    model: Any
    inputs: dict[str, Any]
    call: Callable[[Any, dict[str, Any]], Any] = call_kwargs
    entry: ZooEntry | None = None
    num_parameters: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def run(self) -> Any:
        """Run once without autograd (what the CPU baseline does)."""
        with torch.no_grad():
            return self.call(self.model, self.inputs)
