"""What `diagnose` reports (core.py): the Diagnosis record, the statuses it explains, and the helpers that
fill it (tensor differences as plain numbers, an error's first line)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from harness.core import errors
from harness.diagnose.ops import TensorDiff


FAILING = ("fail_accuracy", "fail_to_run", "compile_fail")


@dataclass
class Diagnosis:
    entry_id: str
    mode: str
    status: str  # pass | fail_accuracy | fail_to_run | compile_fail | baseline_fail | not_available
    summary: str = ""
    located_module: str = ""
    module_class: str = ""
    located_op: str = ""
    outer_op: str = ""  # the op the dispatch mode saw fail when `.op` names an op of its decomposition
    op_inputs: list = field(default_factory=list)  # "float32[4, 32]", ... for each argument
    op_kwargs: dict = field(default_factory=dict)
    error_type: str = ""
    error_message: str = ""
    graph_breaks: list = field(default_factory=list)
    output_diffs: list = field(default_factory=list)  # whole-model outputs that diverge
    module_diffs: list = field(default_factory=list)  # the located module's outputs
    op_diffs: list = field(default_factory=list)  # the located op's outputs
    downstream: list = field(default_factory=list)  # modules that diverged earlier, on already diverged inputs
    notes: list = field(default_factory=list)
    modules_compared: int = 0
    ops_replayed: int = 0
    precision: str = "highest"
    dtype: str = "float32"
    tol: float = 0.0
    seconds: float = 0.0
    repro_path: str = ""
    report_path: str = ""
    phase: str = "inference"  # train: harness/diagnose/train.py
    located_parameter: str = ""  # train: the parameter of the first diverging gradient or weight
    located_step: int = 0  # train: the step (1..N) where the first diverging tensor is
    located_tensor: str = ""  # train: that tensor, loss.stepK | grad.<param> | weight.<param> (after step K)

    def to_json(self) -> dict:
        return asdict(self)

    def row_fields(self) -> dict:
        """The results.csv columns diagnose fills."""
        found = self.located_op or self.module_class
        if self.located_parameter:  # a train row names its first diverging gradient's parameter there
            return {"located_module": self.located_parameter, "located_op": self.located_op,
                    "repro_path": self.repro_path}
        return {"located_module": self.located_module or ("<model>" if found else ""),
                "located_op": self.located_op, "repro_path": self.repro_path}


def diff_dicts(diffs: list[TensorDiff], limit: int = 8) -> list[dict]:
    out = []
    for d in diffs[:limit]:
        out.append({"name": d.name, "match": d.match, "max_abs_err": finite_or_none(d.max_abs_err),
                    "max_rel_err": finite_or_none(d.max_rel_err), "cosine": finite_or_none(d.cosine), "reason": d.reason})
    return out


def finite_or_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def first_line(exc: BaseException) -> str:
    return errors.normalise(str(exc) or repr(exc))
