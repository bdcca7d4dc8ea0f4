"""Failure categories: every entry that does not run on the CPU baseline gets exactly one."""

from __future__ import annotations

import re

from harness.zoo.entry import ZooBuildError

CATEGORIES = (
    "not_available",  # hub id not resolvable offline
    "missing_dependency",  # an optional package (timm, torchaudio, ...) is not installed
    "over_budget",  # the shrunk model still has more parameters than the budget
    "config_error",  # the shrunk config is rejected by its class
    "init_error",  # the model constructor raised
    "missing_input",  # forward wants an input the builder did not make
    "shape_mismatch",  # shapes / geometry inconsistent between config, inputs and weights
    "timeout",  # the per-entry time limit passed
    "oom",  # the worker's memory cap was hit
    "crash",  # the worker process died
    "other",
)

_DEPENDENCY = re.compile(r"requires? the .* librar|not installed|No module named|pip install|requires .*backend", re.I)
_MISSING_INPUT = re.compile(r"required positional argument|You have to specify|must (be )?(provide|specif|pass)|"
                            r"cannot be None|should be provided|is required|You must|need to provide|"
                            r"Either .* or|NoneType' object is not (subscriptable|iterable)|"
                            r"'NoneType' object has no attribute|missing \d+ required", re.I)
_SHAPE = re.compile(r"size of tensor|shape|must match|mat1 and mat2|Kernel size|expected .*(size|dim|channels)|"
                    r"out of range|index|dimension|size mismatch|divisible|invalid for input|Sizes of tensors|"
                    r"channels|tokens do not match|features and .* tokens|Calculated padded input size|"
                    r"but got|too small|not equal", re.I)


def classify(exc: BaseException, stage: str) -> str:
    """The category of an exception raised at `stage` (config, init, inputs, forward)."""
    if isinstance(exc, ZooBuildError) and exc.category != "other":
        return exc.category
    msg = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError):
        return "oom"
    if isinstance(exc, ImportError) or _DEPENDENCY.search(msg):
        return "missing_dependency"
    stage = getattr(exc, "stage", stage)
    if stage == "config":
        return "config_error"
    if stage == "init":
        return "init_error"
    if _MISSING_INPUT.search(msg):
        return "missing_input"
    if _SHAPE.search(msg):
        return "shape_mismatch"
    return "other"


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\r", "")
    line = " ".join(text.split("\n")[:3])
    return line[:limit]
