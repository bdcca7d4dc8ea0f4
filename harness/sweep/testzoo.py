"""Purpose-built entries for testing the harness itself: `--zoo test` (all of them) or
`--zoo test:NAME[*COUNT],NAME...` (e.g. `test:pass*10,abort`). They are never part of the real zoo.

Each misbehaves only on the backend (the `tpu` runs, or the cpu stand-in's backend phase), so the CPU baseline
runs and the status is the backend's:

    pass        a tiny MLP: `pass`
    raise       NotImplementedError naming aten::foo.default: `fail_to_run` with failing_op
    compile     uses torch.cosh, which the cpu stand-in's compiler refuses: `compile_fail` (compiled mode)
    abort       os.abort(): `crash`
    sleep       sleeps past any sensible timeout: `timeout`
    oom         allocates until the memory cap stops it: `oom`
    perturb     output + 1e-2: `fail_accuracy`
    baseline    raises on the CPU baseline too: `baseline_fail`
    missing     cannot be built: `not_available`
    slow        a `pass` that takes ~0.4 s (for kill/resume tests)
    stateful    caches a tensor derived from its weights as a plain attribute at its first forward (as
                Transformers' Mimi codebook does with `_embed`): `pass` if every run gets a fresh copy
    opaque      calls a custom op without a fake (meta) kernel: Dynamo cannot trace it for any backend, so it
                is `compile_fail` with cause `upstream` (aot_eager on CPU fails too); `compile` is the
                `cause=backend` case (only the backend refuses it)
    tracediff   computes something else while Dynamo traces it (as Transformers' Aimv2 and PaliGemma build
                their attention masks): compiled `fail_accuracy` with cause `upstream` (aot_eager on CPU fails
                the rule too); `perturb` is the `cause=backend` case
    numpy       a `pass` with NumPy arithmetic in its forward (as LightGlue's layer thresholds): Dynamo fails on
                it under a TorchFunctionMode, so it compiles only if the shared draws stay off for a model that
                draws nothing
    recompile   a `pass` whose forward reads a call counter (a Python int attribute): compiled mode traces a new
                graph on every call, so the row is flagged `recompiles` in steady state
    pipeline    a `pass` whose model is not a torch.nn.Module but a callable holding one, called under no_grad
                (as a diffusers pipeline): its train rows are `skipped`, not trainable
    nullgrad    a `pass` with attention over its hidden units whose key bias has a zero gradient in exact
                arithmetic (softmax ignores a shift shared by all keys): its float32 gradient is rounding noise
    nullmove    `nullgrad` whose loss also follows its key bias's distance from its initial value (an L1 pull
                towards the initial weights, as fine-tuning regularisers pull towards pretrained ones): zero
                gradient at the initial weights, yet any move AdamW makes of the noise reaches the later steps'
                losses (BLIP-2's query tokens); the outputs are scaled up so that the noise is well above AdamW's eps
    zerobias    a `pass` with a zero-initialised bias half of whose elements have a zero gradient in exact
                arithmetic (they are centred over the batch), the other half a real one: AdamW moves the noisy
                half by about +-lr per step in directions that differ between CPU and tpu (a norm's bias in a
                Diffusers UNet); the loss is scaled up so that the noise is well above Adam's eps
    residue     a `pass` with attention over nearly equal keys (1e-3 apart): softmax's gradients sum to zero over
                the keys, so the query's and key's weight gradients are small residues of cancellation whose
                float32 rounding CPU and tpu do not share; tpu lands beyond the rule's 2x CPU's distance from float64
                where a CPU run nudged by one ulp lands too (BioGPT's q_proj.bias): a float32-spread pass
    subnormal   a `pass` with a branch scaled so far down that its weight's gradient sums float32 subnormal
                products to values near float32's smallest normal: CPU keeps the subnormal terms, tpu flushes them
                to zero as a TPU does (DeepSeek-OCR2's SAM encoder); a gradient of that size is null (train.py)
    flushsum    `subnormal` with the branch's weight gradient a contraction of 1024 subnormal products, summing to
                ~100x float32's smallest normal in float64 and on CPU, and to zero on tpu, which flushes each
                product (GotOcr2's relative-position table): a pass judged against CPU with flush-to-zero, the
                float32 a TPU computes (train_spread.py), and uninformative
    carried     a `pass` with a conv whose channels are normalised by running statistics its forward updates
                from each batch (batch norm's update, momentum 0.5, then normalisation with the new statistics):
                a step's loss reads the buffers the step before wrote, so the state carried across steps is
                more than the weights and AdamW's moments (train_carry.py's transition check)

With HF_TPU_SWEEP_TEST_LOG=path each build appends "<entry_id> <pid>" to that file (exactly-once tests).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.zoo.entry import ZooEntry

KINDS = ("pass", "raise", "compile", "abort", "sleep", "oom", "perturb", "baseline", "missing", "slow", "opaque",
         "stateful", "recompile", "nullgrad", "pipeline", "tracediff", "numpy", "zerobias", "nullmove", "residue",
         "subnormal", "flushsum", "carried")
DEFAULT_SET = ("pass", "raise", "compile", "abort", "sleep", "oom", "perturb", "baseline", "missing")
EXPECTED_STATUS = {
    "pass": "pass", "raise": "fail_to_run", "compile": "compile_fail", "abort": "crash", "sleep": "timeout",
    "oom": "oom", "perturb": "fail_accuracy", "baseline": "baseline_fail", "missing": "not_available",
    "slow": "pass", "opaque": "compile_fail", "stateful": "pass",
    "recompile": "pass", "nullgrad": "pass", "pipeline": "pass", "tracediff": "fail_accuracy", "numpy": "pass",
    "zerobias": "pass", "nullmove": "pass", "residue": "pass", "subnormal": "pass", "flushsum": "pass",
    "carried": "pass",
}
_SPEC_RE = re.compile(r"^([a-z]+)(?:\*(\d+))?$")


@dataclass
class TestBuilt:
    model: Any
    inputs: dict
    call: Callable


@dataclass(frozen=True)
class TestEntry(ZooEntry):
    """A zoo entry (same fields, same contract) that misbehaves on purpose, as `kind` says."""

    kind: str = "pass"

    def build(self, seed: int = 0) -> TestBuilt:
        log = os.environ.get("HF_TPU_SWEEP_TEST_LOG")
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{self.id} {os.getpid()}\n".encode())
            finally:
                os.close(fd)
        if not self.available:
            raise RuntimeError(self.reason)
        import torch

        torch.manual_seed(seed)
        model = _make_model(self.kind).eval()
        if self.kind == "pipeline":
            model = _Pipeline(model)
        inputs = {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))}
        return TestBuilt(model=model, inputs=inputs, call=_call)


def _call(model, inputs):
    return model(**inputs)


class _Pipeline:
    """A callable holding a module, as a diffusers pipeline: `.to(device)` moves it, calls run under no_grad."""

    def __init__(self, module):
        self.module = module

    def to(self, *args, **kwargs):
        self.module.to(*args, **kwargs)
        return self

    def __call__(self, **inputs):
        import torch

        with torch.no_grad():
            return self.module(**inputs)


def _make_model(kind: str):
    import torch
    from torch import nn

    from harness.sweep.device import on_backend

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 8)
            self._cache = None  # "stateful": not a buffer, so `.to()` does not move it
            self.calls = 0  # "recompile": Dynamo specializes on it (dynamic=False), a new graph each call
            if kind in ("nullgrad", "nullmove"):  # created last: the other layers' initial weights are those of `pass`
                self.key = nn.Linear(32, 32)
            if kind == "nullmove":
                self.register_buffer("key_bias0", self.key.bias.detach().clone())
            if kind == "zerobias":
                self.mix = nn.Linear(32, 32)
                nn.init.zeros_(self.mix.bias)
            if kind == "residue":
                self.query, self.key = nn.Linear(32, 32), nn.Linear(32, 32)
            if kind in ("subnormal", "flushsum"):
                self.tiny = nn.Linear(32, 8, bias=False)
            if kind == "carried":
                self.conv, self.head = nn.Conv1d(2, 4, 3, padding=1), nn.Linear(64, 8)
                self.register_buffer("stat_mean", torch.zeros(4))
                self.register_buffer("stat_var", torch.ones(4))

        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(x))
            if kind == "compile":
                h = torch.cosh(h * 0.1)
            if kind == "opaque":
                h = _opaque_op()(h)
            if kind in ("nullgrad", "nullmove"):  # q.(k + b) = q.k + q.b: one shift for every key, gone after softmax
                h = torch.softmax(h @ self.key(h).T / 32**0.5, dim=-1) @ h
            if kind == "zerobias":  # centring over the batch removes the bias of the last 16 units exactly
                z = self.mix(h)
                h = torch.tanh(torch.cat([z[:, :16], z[:, 16:] - z[:, 16:].mean(0, keepdim=True)], 1))
            if kind == "residue":  # keys 1e-3 apart: the scores' gradient w.r.t. the query nearly cancels
                k = self.key(h)
                k = k.mean(0) + 1e-3 * (k - k.mean(0))
                h = torch.softmax(self.query(h) @ k.T, dim=-1) @ h
            out = self.fc2(h)
            if kind == "carried":
                c = self.conv(h.view(-1, 2, 16))
                torch.nn.functional.batch_norm(c.detach(), self.stat_mean, self.stat_var, training=True, momentum=0.5)
                n = torch.nn.functional.batch_norm(c, self.stat_mean, self.stat_var, training=False)
                out = out + self.head(torch.relu(n).flatten(1))
            if kind == "subnormal":  # dW = (u * 1e-19)^T (g * 1e-19): subnormal products summing to up to 2.4x
                # float32's smallest normal in 4 elements (column 0), float64 RMS 0.23x it (measured)
                u = torch.cat([h[:, :1] * 300.0, torch.zeros_like(h[:, 1:])], 1)
                out = out + self.tiny(u * 1e-19) * 1e-19
            if kind == "flushsum":  # dW = (g * 5e-19)^T (u * 5e-19) over 1024 rows (the batch 256 times over):
                # each product ~1e-39 (subnormal), their sum ~1e-36
                u = h.repeat(256, 1) * 5e-19
                out = out + (self.tiny(u) * 5e-19).view(256, *out.shape).sum(0)
            if kind in ("zerobias", "residue"):
                out = out * 100.0  # gradients ~1e2: their float32 noise (~1e-6) is far above AdamW's eps (1e-8)
            if kind == "nullmove":  # |0|'s gradient is 0: the pull adds nothing to the key bias's gradient at first
                out = 100.0 * (out + 10.0 * (self.key.bias - self.key_bias0).abs().sum())
            if kind == "recompile":
                self.calls += 1
                out = out + 0.0 * self.calls
            if kind == "stateful":
                if self._cache is None:
                    self._cache = self.fc2.bias * 0.5
                out = out + self._cache
            backend = on_backend(x)
            if kind == "raise" and backend:
                exc = NotImplementedError("no lowering for aten::foo.default on tpu")
                exc.op = "aten::foo.default"  # type: ignore[attr-defined]
                raise exc
            if kind == "baseline":
                raise ValueError("this model does not run on CPU either")
            if kind == "abort" and backend:
                os.abort()
            if kind == "sleep" and backend:
                time.sleep(3600)
            if kind == "oom" and backend:
                hog = []
                while True:  # grows until the memory cap stops the worker
                    hog.append(torch.ones(64 * 2**20 // 4))
                    time.sleep(0.005)
            if kind == "perturb" and backend:
                out = out + 1e-2
            if kind == "numpy":
                import numpy as np

                out = out * float(np.clip(0.8 + 0.1 * np.exp(-4.0 * 1 / 9), 0, 1))
            if kind == "tracediff" and torch.compiler.is_compiling():
                out = out + 1e-2
            if kind == "slow":
                time.sleep(0.4 if not torch.compiler.is_compiling() else 0)
            return {"logits": out, "hidden": h}

    return Tiny()


_OPAQUE = None


def _opaque_op():
    """`hf_tpu_test::opaque` (x * 2): a custom op registered without a fake kernel, as model code with a custom
    kernel often is. Eager runs it; Dynamo's fake-tensor tracing cannot, whatever the backend."""
    global _OPAQUE
    if _OPAQUE is None:
        import torch

        # the schema is spelled out: this module's postponed annotations are strings infer_schema cannot read
        @torch.library.custom_op("hf_tpu_test::opaque", mutates_args=(), schema="(Tensor x) -> Tensor")
        def opaque(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        _OPAQUE = opaque
    return _OPAQUE


def parse_spec(spec: str) -> list[TestEntry]:
    """`test` or `test:NAME[*COUNT],...` -> entries. Raises ValueError naming a bad part."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    parts = [p.strip() for p in body.split(",") if p.strip()] if body else list(DEFAULT_SET)
    entries: list[TestEntry] = []
    for part in parts:
        m = _SPEC_RE.match(part)
        if not m or m.group(1) not in KINDS:
            raise ValueError(f"unknown test entry {part!r} in --zoo {spec!r} (known: {', '.join(KINDS)})")
        kind, count = m.group(1), m.group(2)
        n = int(count) if count else 1
        for i in range(n):
            eid = f"test/{kind}" if count is None else f"test/{kind}_{i:03d}"
            entries.append(TestEntry(
                id=eid, library="test", model_type=kind, model_class="Tiny",
                task="test-" + ("regression" if kind in ("pass", "slow", "perturb", "recompile", "nullgrad", "pipeline",
                                                         "zerobias", "nullmove", "residue", "subnormal")
                                else "failure"),
                available=kind != "missing", reason="not cached offline (test entry)" if kind == "missing" else "",
                kind=kind,
            ))
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise ValueError(f"--zoo {spec!r} names an entry twice")
    return entries
