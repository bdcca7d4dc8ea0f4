"""hf-tpu diagnose: a perturbed lowering is found (op and module), a missing lowering is found, every repro
reproduces the failure in a fresh process (with the same fault injected by a sitecustomize), a passing model passes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import diagnose_faults
import pytest
import torch
from torch import nn

from harness.diagnose import diagnose_built
from harness.diagnose.report import markdown

HERE = Path(__file__).parent


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.act = nn.GELU()
        self.down = nn.Linear(64, 32)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Inner(nn.Module):
    def forward(self, x):
        return torch.erfinv(torch.tanh(x) * 0.5)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.inner = Inner()

    def forward(self, x):
        return x + self.inner(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.mlp = MLP()
        self.block = Block()
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.mlp(h)
        return {"logits": self.head(self.block(h)), "hidden": h}


def _call(model, inputs):
    return model(**inputs)


def built():
    torch.manual_seed(0)
    return SimpleNamespace(model=Net().eval(), inputs={"x": torch.randn(4, 16)}, call=_call)


def run_repro(path: str, fault: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if fault:
        site = tmp_path / f"site-{fault}"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(diagnose_faults.SITECUSTOMIZE.format(here=str(HERE), name=fault))
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture
def fault():
    with contextlib.ExitStack() as stack:
        yield lambda name: stack.enter_context(diagnose_faults.applied(name))


def test_perturbed_lowering_is_located(fault, tmp_path) -> None:
    fault("perturb_gelu")
    d = diagnose_built(built(), "test/net", "eager", out_dir=tmp_path / "d")
    assert d.status == "fail_accuracy"
    assert d.located_op == "aten::gelu.default"
    assert d.located_module == "mlp.act" and d.module_class == "GELU"
    assert d.op_inputs == ["float32[4, 64]"]
    assert d.op_diffs and abs(d.op_diffs[0]["max_abs_err"] - diagnose_faults.PERTURBATION) < 1e-3
    assert d.downstream == []  # nothing diverged before it
    report = json.loads(Path(d.report_path).read_text())
    assert report["located_op"] == "aten::gelu.default"
    assert "aten::gelu.default" in (tmp_path / "d" / "diagnosis.md").read_text()
    assert d.row_fields() == {"located_module": "mlp.act", "located_op": "aten::gelu.default",
                              "repro_path": d.repro_path}

    r = run_repro(d.repro_path, "perturb_gelu", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "REPRODUCED" in r.stdout and "DIFFERS" in r.stdout
    r = run_repro(d.repro_path, None, tmp_path)  # without the fault the op agrees
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "not reproduced" in r.stdout


def test_missing_lowering_is_located(fault, tmp_path) -> None:
    fault("missing_erfinv")
    d = diagnose_built(built(), "test/net", "eager", out_dir=tmp_path / "d")
    assert d.status == "fail_to_run"
    assert d.located_op == "aten::erfinv.default"
    assert d.located_module == "block.inner" and d.module_class == "Inner"
    assert d.op_inputs == ["float32[4, 32]"]
    assert d.error_type == "NoLowering"
    assert "aten::erfinv.default" in markdown(d)
    r = run_repro(d.repro_path, "missing_erfinv", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "REPRODUCED" in r.stdout and "aten::erfinv.default" in r.stdout


def test_passing_model_passes(tmp_path) -> None:
    d = diagnose_built(built(), "test/net", "eager", out_dir=tmp_path / "d")
    assert d.status == "pass", d
    assert d.located_op == "" and d.located_module == "" and d.repro_path == ""
    assert json.loads(Path(d.report_path).read_text())["status"] == "pass"


@pytest.mark.slow
def test_compiled_missing_lowering_is_located(fault, tmp_path) -> None:
    fault("missing_erfinv")
    d = diagnose_built(built(), "test/net", "compiled", out_dir=tmp_path / "d")
    assert d.status == "compile_fail"
    assert d.located_op == "aten::erfinv.default"
    assert d.located_module == "block.inner"
    r = run_repro(d.repro_path, "missing_erfinv", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "REPRODUCED" in r.stdout


@pytest.mark.slow
def test_compiled_perturbed_lowering_is_located(fault, tmp_path) -> None:
    fault("perturb_gelu")
    d = diagnose_built(built(), "test/net", "compiled", out_dir=tmp_path / "d")
    assert d.status == "fail_accuracy", (d.error_type, d.error_message)
    assert d.located_op == "aten::gelu.default"
    assert d.located_module == "mlp.act"
    r = run_repro(d.repro_path, "perturb_gelu", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
