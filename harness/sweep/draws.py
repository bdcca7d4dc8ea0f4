"""Shared randomness: the random draws a model makes in its forward come from one seeded CPU stream.

Reformer's LSH rotations, VITS's noise, Hiera's pretraining mask and DiffusionGemma's block noise are drawn
in the forward. On `tpu` they came from JAX's generator, on CPU from PyTorch's, and in the float64 reference
from PyTorch's generator consuming other bits (64-bit draws), so those rows could never match: a harness
artefact, not a backend difference (the same happens on a real TPU against a GPU baseline). Inside
`shared_draws(seed)` every draw is computed on CPU from one generator seeded with `seed`, in float32 for
floating results (cast to the dtype asked for), and moved to the device asked for: the CPU baseline, the
float64 reference and every tpu mode see the same numbers.

A TorchFunctionMode sees the Python-level calls (`torch.randn(..., device="tpu")`, `x.normal_()`,
`F.dropout(training=True)`). The draw itself runs under `torch._dynamo.disable`, so under torch.compile the
graph breaks at a draw and the drawn tensor is fed into the next graph as an input (Dynamo cannot put a CPU
generator into a graph; a draw inside the graph would come from the backend's generator again). The mode
declares itself draws-only, so the graph cache still serves compiled calls that draw nothing.

The one exception: a model whose results depend on the generator's algorithm itself (none in the zoo so far;
docs/numerics.md keeps the list).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_F = torch.nn.functional
# functions creating a tensor from a shape: (function, is integer-valued)
_FACTORIES = {torch.rand: False, torch.randn: False, torch.randint: True, torch.randperm: True}
_LIKE = {torch.rand_like: torch.rand, torch.randn_like: torch.randn, torch.randint_like: torch.randint}
# functions drawing from tensor parameters, computed on CPU with the tensors moved there
_FROM_TENSORS = {torch.bernoulli, torch.Tensor.bernoulli, torch.multinomial, torch.Tensor.multinomial,
                 torch.normal, torch.poisson}
_IN_PLACE = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.random_,
             torch.Tensor.exponential_, torch.Tensor.geometric_, torch.Tensor.cauchy_, torch.Tensor.log_normal_}
_LOW_FLOATS = (torch.float64, torch.float16, torch.bfloat16)  # drawn in float32, then cast


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _to_cpu32(x):
    """A tensor argument on CPU, in float32 if it is another floating dtype (the float64 reference and a
    bfloat16 run then draw exactly as the float32 baseline does)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        return x.float() if x.dtype in _LOW_FLOATS else x
    return x


class SharedDraws(TorchFunctionMode):
    """Counts the draws it served by function name (`drew`)."""

    # It changes random draws only: hf_tpu's graph cache still serves a compiled graph that draws nothing
    # under it (hf_tpu/compile_cache/cached.py, DRAWS_ONLY), and compiles one that draws the ordinary way,
    # with the mode serving its draws.
    hf_tpu_draws_only = True

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator("cpu").manual_seed(seed)
        self.drew: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FACTORIES or func in _LIKE or func in _FROM_TENSORS or func in _IN_PLACE or (
                func is _F.dropout and _dropout_active(args, kwargs)):
            self.drew[_name(func)] += 1
            return _draw(self.generator, func, args, kwargs)
        return func(*args, **kwargs)

    def summary(self) -> str:
        return ";".join(f"{k}:{v}" for k, v in sorted(self.drew.items()))


def _dropout_active(args, kwargs) -> bool:
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", args[2] if len(args) > 2 else True)
    return bool(training) and p > 0


@torch._dynamo.disable  # a graph break: the draw runs eagerly on CPU, its result enters the next graph
def _draw(gen: torch.Generator, func, args, kwargs):
    kwargs.pop("generator", None)  # the model's own generator is replaced by the shared stream
    if func in _IN_PLACE:
        self, rest = args[0], [_to_cpu32(a) for a in args[1:]]
        tmp = torch.empty(self.shape, dtype=torch.float32 if self.dtype in _LOW_FLOATS else self.dtype)
        getattr(tmp, func.__name__)(*rest, generator=gen, **{k: _to_cpu32(v) for k, v in kwargs.items()})
        with torch.no_grad():
            self.copy_(tmp)
        return self
    if func is _F.dropout:
        x = args[0]
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        keep = torch.empty(x.shape).bernoulli_(1.0 - p, generator=gen)
        return x * keep.to(device=x.device, dtype=x.dtype) / (1.0 - p)
    if func in _LIKE:
        x, rest = args[0], list(args[1:])
        device, dtype = kwargs.pop("device", None) or x.device, kwargs.pop("dtype", None) or x.dtype
        kwargs.pop("memory_format", None)
        kwargs.pop("layout", None)
        base = _LIKE[func]
        if base is torch.randint:
            low, high = (0, rest[0]) if len(rest) == 1 else (rest[0], rest[1])
            out = torch.randint(low, high, tuple(x.shape), generator=gen, dtype=dtype)
        else:
            out = base(tuple(x.shape), generator=gen, dtype=torch.float32 if dtype in _LOW_FLOATS else dtype)
        return out.to(device=device, dtype=dtype)
    if func in _FACTORIES:
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        out_t = kwargs.pop("out", None)
        if out_t is not None:
            device, dtype = out_t.device, out_t.dtype
        draw_dtype = torch.float32 if dtype in _LOW_FLOATS else dtype
        out = func(*args, generator=gen, dtype=draw_dtype, **kwargs) if draw_dtype is not None else \
            func(*args, generator=gen, **kwargs)
        out = out.to(device=device or "cpu", dtype=dtype or out.dtype)
        if out_t is not None:
            return out_t.copy_(out)
        return out
    # drawn from tensor parameters: on CPU in float32, back to the first tensor's device and dtype
    first = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), None)
    out = func(*[_to_cpu32(a) for a in args], generator=gen, **{k: _to_cpu32(v) for k, v in kwargs.items()})
    if first is None:
        return out
    dtype = first.dtype if out.is_floating_point() else out.dtype
    return out.to(device=first.device, dtype=dtype)


@contextlib.contextmanager
def shared_draws(seed: int) -> Iterator[SharedDraws]:
    """Within the block, every random draw of a forward comes from a CPU generator seeded with `seed`."""
    with SharedDraws(seed) as mode:
        yield mode
