"""Op parity with CPU over PyTorch's OpInfo database on tpu: forward and backward (gradients w.r.t. every
differentiable input for float32, bfloat16 and float16), dtypes float32, bfloat16, float16, int32, int64,
bool and complex64 (op_parity.py holds the machinery, the tolerances and the report). The fast set runs a
deterministic sample (every 10th op, one sample); the whole database runs under -m slow.
`python -m tests.hf_tpu.op_parity` writes the report grouping failures by cause (reports/op_parity.md)."""

from __future__ import annotations

import json
import os

import op_parity
import pytest
import torch

# Floors: (op, dtype) pairs that must pass, forward and backward. Raise them when lowerings improve.
# Measured 2026-12-03 (every 10th op, 1 sample, eager; python -m tests.hf_tpu.op_parity --stride 10 --samples 1
# -> reports/op_parity/eager-s10.md): forward 316 of 317 (99.7%, 1 pair declared unsupported apart), backward
# 135 of 137 (98.5%) (was 297/321 and 122/129 on 2026-12-02). Re-measured 2026-12-03 20:47 by this test
# (pytest -s tests/hf_tpu/test_op_parity.py -k test_opinfo_parity_sample, main dde3127): forward 316 of 317,
# backward 136 of 137 (left: mish float16 backward values; norm.nuc complex64, _linalg_svd raises).
# Re-measured 2026-12-06 04:52 by this test (pytest -s tests/hf_tpu/test_op_parity.py -k test_opinfo_parity_sample,
# ops-8 at 7bd5289): forward 317 of 317 (norm.nuc complex64 now passes), backward 136 of 137 (mish float16).
# Re-measured 2026-12-07 01:50 by this test (same command, ops-9 at 0b02a71): forward 317 of 317, backward 137 of
# 137 (mish_backward is one op on tpu now, in float32 as CPU's kernel).
FLOOR_SAMPLE = {"forward": 317, "backward": 137}
# The whole database, 2 samples, eager: measured 2026-12-03 (python -m tests.hf_tpu.op_parity --stride 1
# --samples 2 --resume -> reports/op_parity/eager-s1.md; the pairs after the first 2,701 ran on 552e6e4, the
# first ones on that day's earlier commits): forward 3050 of 3208 (95.1%, 6 declared unsupported apart),
# backward 1291 of 1342 (96.2%) (was 2919/3220 and 1188/1274 on 2026-12-02). About 3 h at nice 10 here.
# Re-measured 2026-12-07 09:09-09:26 in one run on one code (main fde5ce7; python -m tests.hf_tpu.op_parity --out
# reports/op_parity/eager-s1-run2.md, 17 min at nice 19 on the shared 2-core host): forward 3172 of 3182 (99.7%,
# 25 declared unsupported apart), backward 1370 of 1381 (99.2%).
FLOOR_FULL = {"forward": 3172, "backward": 1370}
# The whole database through torch.compile(backend="tpu"), one run on one code (main 7114b09; python -m
# tests.hf_tpu.op_parity --compiled --out reports/op_parity/compiled-s1-run2.md, 63 min loaded): forward 3165 of
# 3182 (99.5%, 25 declared unsupported apart), backward 1368 of 1381 (99.1%). Again 2026-12-07 09:36-10:30 (main
# 1077182; same command, --out reports/op_parity/compiled-s1-run3.md, 54 min loaded): forward 3172 of 3182 (99.7%),
# backward 1369 of 1381 (99.1%).
FLOOR_COMPILED_FULL = {"forward": 3172, "backward": 1369}


# The same sample through torch.compile(backend="tpu") (python -m tests.hf_tpu.op_parity --stride 10 --samples 1
# --compiled -> reports/op_parity/compiled-s10.md), measured 2026-12-03: forward 306 of 318 (96.2%), backward
# 124 of 128 (was 293/321 and 120/124 earlier the same day). Re-measured 2026-12-03 20:50 by the slow test
# (pytest -s -k test_opinfo_parity_compiled_sample, main dde3127): forward 313 of 318, backward 132 of 134.
# Again 2026-12-07 (main 4aa5f2c): forward 313 of 318, backward 133 of 134; with view_as_complex float16 declared
# unsupported in graphs as in eager: forward 313 of 317 (1 apart), backward 133 of 134; with custom ops' bodies
# traced into graphs (linear_cross_entropy.chunked): forward 316 of 317, backward 136 of 137. Re-measured
# 2026-12-07 09:52 by the slow test (same command, ops-12 at 0bdf3d9; 2 min): forward 317 of 317, backward 137 of
# 137 (histogram's meta kernel, eigvals' error check).
FLOOR_COMPILED_SAMPLE = {"forward": 317, "backward": 137}


def _run(stride: int, samples: int, floor: dict[str, int], capsys, compiled: bool = False) -> None:
    tally = op_parity.sweep(op_parity.ops(stride), samples, compiled)
    with capsys.disabled():
        print("\n" + op_parity.markdown(tally, f"OpInfo parity on tpu (every {stride} op, {samples} samples)"))
    for direction, want in floor.items():
        got, total = tally.total(direction)
        assert got >= want, f"{direction}: {got} of {total} (op, dtype) pairs match CPU, floor {want}"


@pytest.mark.usefixtures("highest")
def test_opinfo_parity_sample(capsys) -> None:
    """CI's share: every 10th OpInfo op, one sample each, every dtype, forward and backward."""
    _run(stride=10, samples=1, floor=FLOOR_SAMPLE, capsys=capsys)


@pytest.mark.slow
@pytest.mark.usefixtures("highest")
def test_opinfo_parity_compiled_sample(capsys) -> None:
    """The fast set's sample through torch.compile(backend="tpu"), one graph per call (~20 min here)."""
    _run(stride=10, samples=1, floor=FLOOR_COMPILED_SAMPLE, capsys=capsys, compiled=True)


def _run_full(tmp_path, floor: dict[str, int], capsys, compiled: bool) -> None:
    # a fresh journal: resuming the committed reports/op_parity/eager-s1.jsonl re-counted its old results
    samples = int(os.environ.get("HF_TPU_OPINFO_SAMPLES", "2"))
    tally = op_parity.run_chunked(tmp_path / "journal.jsonl", stride=1, samples=samples, compiled=compiled, chunk=40)
    with capsys.disabled():
        mode = "compiled" if compiled else "eager"
        print("\n" + op_parity.markdown(tally, f"OpInfo parity on tpu ({mode}, every op, {samples} samples)"))
    for direction, want in floor.items():
        got, total = tally.total(direction)
        assert got >= want, f"{direction}: {got} of {total} (op, dtype) pairs match CPU, floor {want}"


@pytest.mark.slow
def test_opinfo_parity_full(tmp_path, capsys) -> None:
    """The whole database in child processes of 40 ops (op_parity.run_chunked): one process compiling every
    op's programs is what ran into vm.max_map_count before program_bound.py; a crash costs one pair now."""
    _run_full(tmp_path, FLOOR_FULL, capsys, compiled=False)


@pytest.mark.slow
def test_opinfo_parity_compiled_full(tmp_path, capsys) -> None:
    """The whole database through torch.compile(backend="tpu"), one graph per call (about an hour here)."""
    _run_full(tmp_path, FLOOR_COMPILED_FULL, capsys, compiled=True)


@pytest.mark.slow  # three child processes: ~2 min on a loaded 2-core host
def test_a_crashing_pair_costs_one_pair(tmp_path, monkeypatch) -> None:
    """A child killed by a segfault in one pair: that pair is recorded as a failure naming the crash, and the
    run goes on to the rest of its chunk and the next (every 350th op: abs, isposinf; one op per child)."""
    monkeypatch.setenv("OP_PARITY_CRASH_AT", "abs:int32")
    journal = tmp_path / "journal.jsonl"
    tally = op_parity.run_chunked(journal, stride=350, samples=1, compiled=False, chunk=1)
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    finished = {(r["op"], r["dtype"]): r for r in records if "forward" in r}
    assert finished[("abs", "int32")]["forward"] == "process crash (signal 11)"
    assert finished[("abs", "float32")]["forward"] == "pass"  # run before the crash, kept
    assert ("abs", "int64") in finished and ("isposinf", "float32") in finished  # run after it
    assert tally.causes["process crash (signal 11)"] == 1


@pytest.mark.usefixtures("highest")
def test_tensor_split_indices_stay_on_cpu() -> None:
    """tensor_split's index tensors are CPU tensors on every device (PyTorch requires it); the harness moved
    them to tpu and counted PyTorch's own error as 7 failing pairs."""
    (op,) = [o for o in op_parity.ops() if o.name == "tensor_split"]
    for dtype in (torch.float32, torch.int64):
        backward = None if dtype == torch.int64 else "pass"
        assert op_parity.check(op, dtype, samples=4) == op_parity.Result("pass", backward)


@pytest.mark.usefixtures("highest")
def test_as_strided_of_a_view_compares_the_moved_tensor() -> None:
    """as_strided.partial_views' inputs are base[5:15] of a 20-element CPU storage, and storage_offset=0 reads
    the base's first elements on CPU; the tensor moved to tpu owns only its 10 (as on any device). CPU runs the
    same compact input (op_parity.COMPACT_INPUT): 6 pairs differed by the harness alone. Past the compact
    storage, both devices raise."""
    (op,) = [o for o in op_parity.ops() if op_parity.pair_name(o) == "as_strided.partial_views"]
    for dtype in (torch.float32, torch.int64, torch.complex64):
        backward = "pass" if dtype == torch.float32 else None
        assert op_parity.check(op, dtype, samples=3) == op_parity.Result("pass", backward)
    x = torch.arange(10.0)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.to("tpu").as_strided((2, 2), (1, 2), 10)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.as_strided((2, 2), (1, 2), 10)
