"""The per-op-class accounting shared by profile_forward.py and profile_train.py: which class an ATen op
belongs to, a torch.profiler trace summed per class, and the side-by-side table (CPU, tpu, tpu's XLA part,
tpu's dispatch part).

An op is counted where its self time is spent, so a composite op (linear) counts where its kernel (addmm)
runs. Autograd Functions written in Python (hf-tpu's fused cross-entropy, hf_tpu/cross_entropy.py) run their
programs outside any ATen op: the profiler records their forward and backward under the Function's and its
node's names, counted under the class `FUNCTIONS` gives.
"""

from __future__ import annotations

import collections
from typing import Any

FORWARD_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("addmm", "mm", "bmm", "matmul", "linear", "baddbmm", "addbmm", "dot")),
    ("attention", ("scaled_dot_product", "softmax", "_softmax", "flash_attention", "efficient_attention")),
    ("normalisation", ("layer_norm", "rms_norm", "native_layer_norm")),
    ("embedding/indexing", ("embedding", "index", "gather", "scatter", "take", "masked_fill", "where")),
    ("layout/views", ("view", "reshape", "transpose", "permute", "t", "expand", "contiguous", "clone", "copy_",
                      "_to_copy", "to", "slice", "select", "split", "unsqueeze", "squeeze", "cat", "stack",
                      "as_strided", "_unsafe_view", "alias", "detach", "empty", "empty_strided", "_reshape_alias",
                      "split_with_sizes", "narrow", "unbind", "lift_fresh", "arange", "ones", "zeros", "full")),
    ("elementwise", ("add", "sub", "mul", "div", "pow", "tanh", "gelu", "silu", "neg", "rsqrt", "sqrt", "exp",
                     "mean", "sum", "cos", "sin", "sigmoid", "relu", "abs", "add_", "mul_", "div_", "eq", "ne",
                     "lt", "gt", "le", "ge", "bitwise_and", "bitwise_or", "logical_not", "le_", "fill_", "max",
                     "min", "cumsum", "any", "all", "rsub", "reciprocal", "clamp", "float")),
)

_FWD = dict(FORWARD_CLASSES)
# a training step: the forward's classes plus the loss, the backward's ops and the optimizer
TRAIN_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("optimizer", ("fused_adamw", "fused_adam", "foreach", "fused_sgd")),
    ("loss", ("nll_loss", "log_softmax", "cross_entropy", "_log_softmax")),
    ("matmul", _FWD["matmul"]),
    ("attention", (*_FWD["attention"], "_softmax_backward_data")),
    ("normalisation", (*_FWD["normalisation"], "native_layer_norm_backward")),
    ("embedding/indexing", (*_FWD["embedding/indexing"], "embedding_dense_backward", "index_put", "index_add")),
    ("elementwise", (*_FWD["elementwise"], "gelu_backward", "tanh_backward", "threshold_backward",
                     "sigmoid_backward", "silu_backward", "zero_", "zeros_like", "ones_like", "_to_copy", "to")),
    ("layout/views", _FWD["layout/views"]),
)

# Python autograd Functions doing real work, by the profiler's names for their forward and backward
FUNCTIONS = {"_CrossEntropy": "loss", "_CrossEntropyBackward": "loss"}


def op_class(name: str, classes: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """The class of ATen op `name` ("aten::addmm", "aten::addmm.out"): an exact name (leading underscores
    ignored) or, for names longer than 4 letters, a prefix (gelu -> gelu_backward)."""
    base = name.removeprefix("aten::").split(".")[0].lstrip("_")
    for cls, names in classes:
        stripped = [n.lstrip("_") for n in names]
        if base in stripped or any(base.startswith(n) for n in stripped if len(n) > 4):
            return cls
    return "other"


def per_class(prof: Any, runs: int, classes: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, list[float]]:
    """{class: [self ms per run, op calls per run]} from a finished torch.profiler.profile over `runs` runs."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for ev in prof.key_averages():
        if ev.key.startswith("aten::"):
            cls = op_class(ev.key, classes)
        elif ev.key in FUNCTIONS:
            cls = FUNCTIONS[ev.key]
        else:
            continue
        row = out[cls]
        row[0] += ev.self_cpu_time_total / 1e3 / runs
        row[1] += ev.count / runs
    return out


def wait(out: Any) -> None:
    """Block until a program's result(s) are computed (for timing it)."""
    for r in out if isinstance(out, tuple | list) else (out,):
        ready = getattr(r, "block_until_ready", None)
        if ready is not None:
            ready()


def print_table(cpu_cls: dict[str, list[float]], tpu_cls: dict[str, list[float]], xla_cls: dict[str, float],
                classes: tuple[tuple[str, tuple[str, ...]], ...], ops_label: str, digits: int) -> tuple[float, float]:
    """The markdown table of ms per class, CPU against tpu (its XLA programs and the rest, dispatch); returns
    the totals over ATen ops (cpu ms, tpu ms)."""
    f = f"{{:.{digits}f}}"
    print(f"| op class | {ops_label} | cpu ms | tpu ms | tpu XLA ms | tpu dispatch ms | tpu/cpu |")
    print("|---|---|---|---|---|---|---|")
    tot = [0.0, 0.0, 0.0]
    for cls in [c for c, _ in classes] + ["other"]:
        c = cpu_cls.get(cls, [0.0, 0.0])
        t = tpu_cls.get(cls, [0.0, 0.0])
        if not c[1] and not t[1]:
            continue
        x = xla_cls.get(cls, 0.0)
        tot[0] += c[0]
        tot[1] += t[0]
        tot[2] += x
        ratio = f"{t[0] / c[0]:.2f}" if c[0] else "-"
        print(f"| {cls} | {t[1]:.0f} | {f.format(c[0])} | {f.format(t[0])} | {f.format(x)} | "
              f"{f.format(t[0] - x)} | {ratio} |")
    print(f"| all ATen ops | | {f.format(tot[0])} | {f.format(tot[1])} | {f.format(tot[2])} | "
          f"{f.format(tot[1] - tot[2])} | {tot[1] / tot[0]:.2f} |")
    return tot[0], tot[1]
