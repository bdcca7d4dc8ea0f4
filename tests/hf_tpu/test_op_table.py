"""hf_tpu/op_registry.py and hf_tpu/op_table.py: every hand-written rule is registered where it is written, the
device runs what the registry says, and `python -m hf_tpu.op_table` answers "which ops do we lower by hand, and
how"."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_tpu import op_registry, op_table

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table() -> dict[str, op_table.Row]:
    return {r.op: r for r in op_table.rows()}


def test_rows_say_whose_lowering_runs(table) -> None:
    assert table["aten::eye.default"].lowering == "ours"  # torchax has none
    assert table["aten::eye.default"].modules == ("hf_tpu.lowering_ops",)
    assert table["aten::convolution.default"].lowering == "ours, over torchax's"
    assert table["aten::add.Tensor"].lowering == "torchax"
    assert table["aten::add.Tensor"].kinds == ()
    assert table["aten::native_layer_norm_backward.default"].lowering == "decomposed"
    assert table["aten::cumsum.default"].flags == ("opmath", "cast_input_first")
    assert table["aten::scaled_dot_product_attention.default"].kinds == ("autograd",)
    assert set(table["aten::native_batch_norm.default"].kinds) == {"jax", "eager"}


def test_the_device_runs_what_the_registry_says() -> None:
    from hf_tpu import backward_lowerings, dispatch, graph_compiler, lowering  # noqa: F401 - they register

    for op, fn in op_registry.table("backward").items():
        assert backward_lowerings.find(op) is fn
    for op in op_registry.table("jax"):
        assert lowering.find(op) is not None, op
    # an eager kernel is what dispatch routes the op to
    route = dispatch._route(aten.view_as_real.default)
    x = torch.randn(3, dtype=torch.complex64)
    torch.testing.assert_close(route(aten.view_as_real.default, (x.to("tpu"),), {}).cpu(), torch.view_as_real(x))
    # a "graph" rule is used in compiled graphs only
    assert graph_compiler._lower_node_target(aten._assert_async.msg) is op_registry.table("graph")[aten._assert_async.msg]


def test_every_rule_in_the_source_is_a_registration() -> None:
    # no op -> function dict of aten ops is left outside the registry: a module-level dict literal whose keys
    # are aten ops and whose values are functions would be a second table to keep
    offenders = []
    for path in sorted((ROOT / "hf_tpu").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Dict) and value.keys and all(
                    k is not None and "aten." in ast.unparse(k) for k in value.keys) and all(
                    isinstance(v, (ast.Name, ast.Lambda, ast.Call)) for v in value.values):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], f"op tables outside op_registry (register with op_registry.lowers): {offenders}"


def test_registering_twice_or_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"registered twice.*hf_tpu.lowering_ops.*keep one"):
        op_registry.lowers(aten.eye.default)(lambda *a: None)
    assert op_registry.table("jax")[aten.eye.default].__module__ == "hf_tpu.lowering_ops"
    with pytest.raises(ValueError, match="unknown lowering kind 'jaxx'"):
        op_registry.lowers(aten.eye.default, kind="jaxx")
    with pytest.raises(ValueError, match="unknown op flag"):
        op_registry.mark("fast", [aten.eye.default])


def test_the_command_lists_our_rules() -> None:
    out = subprocess.run([sys.executable, "-m", "hf_tpu.op_table", "--ours", "--op", "cholesky"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    line = next(l for l in out.splitlines() if l.startswith("aten::linalg_cholesky_ex.default"))
    assert line.split()[1:] == ["ours,", "over", "torchax's", "jax", "lowering"]
    assert "1 ops: 1 ours, over torchax's" in out
