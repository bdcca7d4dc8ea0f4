"""Float32 weights of compiled inference graphs are packed once (MKL's GEMM format) and their arrays dropped
(hf_tpu/packed_weights.py): the products come from the packed copies, the numbers stay within float32's error
of CPU's, the weights read back with their own bits, a write is seen by the next call, and training graphs,
other precisions and shared weights keep XLA's dot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_tpu  # noqa: F401 - registers the tpu device
from hf_tpu import packed_weights
from hf_tpu import tensor as T
from tests.hf_tpu.packed_models import close, pair

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not packed_weights.ENABLED or not packed_weights.available(),
                                reason="no MKL packed GEMM in this PyTorch (ARM), or HF_TPU_PACKED_WEIGHTS=0")


@pytest.fixture(autouse=True)
def _highest() -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.reset()
    yield
    torch.set_float32_matmul_precision(before)


PACKED_PER_CALL = 3  # up, down, conv_w; the tied head stays XLA's


def test_inference_graph_computes_from_packed_copies_and_drops_the_arrays() -> None:
    cpu, tpu, ids = pair()
    compiled = torch.compile(tpu, backend="tpu")
    before = packed_weights.calls()
    with torch.no_grad():
        want = cpu(ids)
        for _ in range(2):
            close(compiled(ids.to("tpu")), want)
    assert packed_weights.calls() - before == 2 * PACKED_PER_CALL
    for w in (tpu.up.weight, tpu.down.weight, tpu.conv_w):
        assert T.payload(w).buf._array is None, "the packed weight's array was kept"
    assert T.payload(tpu.emb.weight).buf._array is not None, "the tied embedding lost its array"
    # read back (state_dict, .cpu()): the weights' own bits, rebuilt from the packed copies, with a warning
    # saying so once per process
    packed_weights._warned = False
    with pytest.warns(RuntimeWarning, match="rebuilt from the packed copy"):
        for name, value in tpu.state_dict().items():
            assert torch.equal(value.cpu().view(torch.int32), cpu.state_dict()[name].view(torch.int32)), name
    # read elsewhere, they keep their arrays from now on (no rebuild on every alternation) and XLA's dot
    with torch.no_grad():
        close(compiled(ids.to("tpu")), want)
        close(compiled(ids.to("tpu")), want)
    assert packed_weights.calls() - before == 2 * PACKED_PER_CALL
    assert T.payload(tpu.up.weight).buf._array is not None


def test_eager_and_compiled_alternating_rebuild_once() -> None:
    cpu, tpu, ids = pair()
    compiled = torch.compile(tpu, backend="tpu")
    rebuilt = []
    real = packed_weights._unpacked
    packed_weights._unpacked = lambda *a: rebuilt.append(a[1]) or real(*a)
    try:
        with torch.no_grad():
            want = cpu(ids)
        for _ in range(3):
            with torch.no_grad():
                close(compiled(ids.to("tpu")), want)
            # eager ops read the weights (with autograd recording: no-grad eager dots would compute from the
            # same packed copies, packed_eager.py)
            close(tpu(ids.to("tpu")).detach(), want)
    finally:
        packed_weights._unpacked = real
    assert len(rebuilt) == PACKED_PER_CALL


def test_graphs_of_other_row_counts_share_the_packed_copies() -> None:
    # a generate() loop: a prefill graph, then decode graphs of one row; none rebuilds a dropped array
    cpu, tpu, _ = pair()
    compiled = torch.compile(tpu, backend="tpu")
    before = packed_weights.calls()
    with torch.no_grad():
        for shape in ((2, 32), (1, 1), (1, 3), (2, 32), (1, 1)):
            ids = torch.randint(0, 300, shape)
            close(compiled(ids.to("tpu")), cpu(ids))
            assert T.payload(tpu.up.weight).buf._array is None
    assert packed_weights.calls() - before == 5 * PACKED_PER_CALL


def test_a_write_is_seen_by_the_next_call() -> None:
    cpu, tpu, ids = pair()
    compiled = torch.compile(tpu, backend="tpu")
    with torch.no_grad():
        compiled(ids.to("tpu"))
        new = torch.randn_like(cpu.up.weight)
        cpu.up.weight.copy_(new)
        tpu.up.weight.copy_(new.to("tpu"))
        cpu.conv_w.mul_(2)
        tpu.conv_w.mul_(2)  # a partial read-modify-write of a dropped array
        close(compiled(ids.to("tpu")), cpu(ids))
    assert torch.equal(tpu.conv_w.cpu(), cpu.conv_w)


def test_training_graphs_keep_xlas_dot() -> None:
    cpu, tpu, ids = pair()
    compiled = torch.compile(tpu, backend="tpu")
    before = packed_weights.calls()
    out = compiled(ids.to("tpu"))
    out.float().pow(2).mean().backward()
    cpu(ids).pow(2).mean().backward()
    assert packed_weights.calls() == before
    assert T.payload(tpu.up.weight).buf._array is not None
    torch.testing.assert_close(tpu.up.weight.grad.cpu(), cpu.up.weight.grad, rtol=1e-4, atol=1e-6)


def test_other_precisions_keep_xlas_dot() -> None:
    torch.set_float32_matmul_precision("medium")
    _, tpu, ids = pair()
    before = packed_weights.calls()
    with torch.no_grad():
        torch.compile(tpu, backend="tpu")(ids.to("tpu"))
    assert packed_weights.calls() == before
    assert T.payload(tpu.up.weight).buf._array is not None


def test_weights_the_copy_cannot_rebuild_keep_their_arrays() -> None:
    # -0.0 would come back +0.0 from the packed copy: such a weight keeps its array and XLA's dot
    cpu, tpu, ids = pair()
    with torch.no_grad():
        cpu.up.weight[0, 0] = -0.0
        tpu.up.weight.copy_(cpu.up.weight.to("tpu"))
        before = packed_weights.calls()
        close(torch.compile(tpu, backend="tpu")(ids.to("tpu")), cpu(ids))
    assert packed_weights.calls() - before == PACKED_PER_CALL - 1
    assert T.payload(tpu.up.weight).buf._array is not None
    assert torch.equal(tpu.up.weight.cpu().view(torch.int32), cpu.up.weight.view(torch.int32))


def test_graph_uses_reads_the_forms_from_the_graph() -> None:
    gm = torch.fx.symbolic_trace(lambda x, w, b, v: torch.addmm(b, x, w.t()) + torch.mm(x, v) + v.sum())
    # symbolic_trace records no fake values: nothing is taken without knowing dtype and shape
    assert packed_weights.graph_uses(gm)[0] == {}


CHILD = r"""
import json, torch, hf_tpu
from hf_tpu import executable_cache, packed_weights
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
x = torch.randn(8, 256)
with torch.no_grad():
    want = m(x)
    got = torch.compile(m.to("tpu"), backend="tpu")(x.to("tpu")).cpu()
print(json.dumps({"calls": packed_weights.calls(), "stats": executable_cache.stats(), "compile": hf_tpu.compile_stats(),
                  "err": float((got - want).abs().max())}))
"""


def test_a_second_process_loading_the_graph_and_program_still_packs(tmp_path: Path) -> None:
    env = {**os.environ, "HF_TPU_CACHE_DIR": str(tmp_path), "HF_TPU_EXECUTABLE_CACHE": "1",
           "HF_TPU_COMPILE_CACHE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("HF_TPU_DISABLE_DISK_CACHE", None)

    def run() -> dict:
        r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["calls"] == 2 and cold["err"] < 1e-5, cold
    # the graph loaded from the graph cache (its placeholders hold meta tensors), Dynamo not run, and its
    # program from the executable cache: the keys are handed over all the same
    warm = run()
    assert warm["compile"]["graphs"] == 0 and warm["compile"]["cache_hits"] >= 1, warm
    assert cold["stats"]["saved"] >= 1 and warm["stats"]["hits"] == cold["stats"]["saved"], warm  # nothing traced
    assert warm["calls"] == 2 and warm["err"] < 1e-5, warm
