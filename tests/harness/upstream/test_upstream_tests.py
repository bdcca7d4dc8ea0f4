"""`hf-tpu upstream-tests` on a tiny synthetic checkout: one test passing on both devices, one failing only on
tpu, one segfaulting on tpu (a real crash: SIGSEGV in the worker); plus the checkout checks."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.upstream import checkout, table

TESTS = textwrap.dedent('''
    import os

    import pytest
    import torch

    DEVICE = os.environ["TRANSFORMERS_TEST_DEVICE"]


    def test_passes_on_both():
        assert (torch.ones(2, device=DEVICE) * 2).sum().item() == 4


    def test_fails_on_tpu_only():
        if DEVICE == "tpu":
            raise NotImplementedError("hf_tpu: no JAX lowering for aten::fake_op.default on tpu")


    def test_segfaults_on_tpu():
        if DEVICE == "tpu":  # a real crash of the worker process, as a native kernel's segfault is
            import os, signal
            os.kill(os.getpid(), signal.SIGSEGV)


    @pytest.mark.skip(reason="not this one")
    def test_skipped():
        pass
''')


def make_checkout(root: Path, version: str | None = None, with_src: bool = True) -> Path:
    fam = root / "tests" / "models" / "fake"
    fam.mkdir(parents=True)
    for d in (root / "tests", root / "tests" / "models", fam):
        (d / "__init__.py").write_text("")
    (fam / "test_modeling_fake.py").write_text(TESTS)
    if with_src:
        (root / "src" / "transformers").mkdir(parents=True)
        (root / "src" / "transformers" / "__init__.py").write_text(
            f'__version__ = "{version or checkout.installed_version()}"\n')
    return root


def test_synthetic_checkout_on_cpu_and_tpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_checkout(tmp_path / "transformers")
    out = tmp_path / "out"
    assert main(["upstream-tests", "--transformers-src", str(src), "--families", "fake", "--jobs", "1",
                 "--out", str(out)]) == 0
    df = pd.read_csv(out / "upstream.csv", keep_default_na=False).set_index("test")
    base = "tests/models/fake/test_modeling_fake.py::"
    assert list(df.columns) == table.COLUMNS[1:]
    assert len(df) == 4
    both, tpu_only, crash, skipped = (df.loc[base + n] for n in (
        "test_passes_on_both", "test_fails_on_tpu_only", "test_segfaults_on_tpu", "test_skipped"))
    assert (both["cpu"], both["tpu"]) == ("passed", "passed")
    assert (tpu_only["cpu"], tpu_only["tpu"]) == ("passed", "failed")
    assert tpu_only["tpu_error_type"] == "NotImplementedError"
    assert tpu_only["tpu_op"] == "aten::fake_op.default"
    assert "no JAX lowering" in tpu_only["tpu_message"]
    # the crash cost one test: the test after it in the file still ran on tpu
    assert (crash["cpu"], crash["tpu"], crash["tpu_error_type"]) == ("passed", "crashed", "WorkerCrash")
    assert (skipped["cpu"], skipped["tpu"]) == ("skipped", "skipped")
    assert both["family"] == "fake"
    md = (out / "upstream.md").read_text()
    assert "33.3% (1/3)" in md
    assert "aten::fake_op.default" in md and "WorkerCrash" in md
    assert "33.3% (1/3)" in capsys.readouterr().out
    # the table can be rebuilt from the records alone
    (out / "upstream.csv").unlink()
    assert main(["upstream-tests", "--transformers-src", str(src), "--out", str(out), "--table-only"]) == 0
    assert len(pd.read_csv(out / "upstream.csv")) == 4


def test_a_checkout_of_another_version_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_checkout(tmp_path / "t", version="0.0.1")
    assert main(["upstream-tests", "--transformers-src", str(src), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "holds Transformers 0.0.1" in err and f"Transformers {checkout.installed_version()} is installed" in err
    assert f"checkout v{checkout.installed_version()}" in err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_a_bare_tests_folder_needs_its_version(tmp_path: Path) -> None:
    src = make_checkout(tmp_path / "t", with_src=False)
    with pytest.raises(checkout.CheckoutError, match="--transformers-version"):
        checkout.check(src)
    assert checkout.check(src, checkout.installed_version()) == checkout.installed_version()
    with pytest.raises(checkout.CheckoutError, match="holds Transformers 1.2.3"):
        checkout.check(src, "1.2.3")
    root, extra = checkout.staged_root(src, tmp_path / "work")
    assert root != src and (root / "tests" / "models" / "fake").is_dir()
    assert (root / "src" / "transformers" / "__init__.py").is_file()  # the installed package
    assert extra == [str(checkout.SHIM)]


def test_unknown_families_and_non_checkouts(tmp_path: Path) -> None:
    src = make_checkout(tmp_path / "t")
    assert checkout.select_families(src, "all") == ["fake"]
    with pytest.raises(checkout.CheckoutError, match="no model tests for llama.*families there: fake"):
        checkout.select_families(src, "fake,llama")
    with pytest.raises(checkout.CheckoutError, match="has no tests/ folder"):
        checkout.check(tmp_path)


def _rec(nodeid: str, when: str, outcome: str, **kw: object) -> dict:
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "xfail": False, "duration": 0.5, **kw}


def test_outcomes_over_phases() -> None:
    recs = [
        _rec("a", "setup", "passed"), _rec("a", "call", "passed"), _rec("a", "teardown", "passed"),
        _rec("b", "setup", "failed", error_type="OSError", message="no file", op=""),
        _rec("b", "teardown", "passed"),
        _rec("c", "setup", "passed"), _rec("c", "???", "failed", error_type="WorkerCrash", message="died", op=""),
        _rec("d", "setup", "passed"), _rec("d", "call", "skipped", xfail=True),
        _rec("e", "setup", "skipped", message="needs gpu"),
        _rec("f", "setup", "passed"), _rec("f", "call", "failed", error_type="Timeout", message="", op=""),
        _rec("g", "setup", "passed"), _rec("g", "call", "failed", error_type="AssertionError", message="x", op=""),
        _rec("g", "teardown", "failed", error_type="RuntimeError", message="later", op=""),
    ]
    got = {k: v["outcome"] for k, v in table.outcomes(recs).items()}
    assert got == {"a": "passed", "b": "error", "c": "crashed", "d": "xfailed", "e": "skipped", "f": "timeout",
                   "g": "failed"}
    assert table.outcomes(recs)["g"]["error_type"] == "AssertionError"  # the first failure is the cause
    df = table.build(recs, recs[:3])
    assert set(df.loc[df["test"] != "a", "tpu"]) == {"missing"}
    assert table.share(df).den == 1  # tests that did not run on tpu are not in the figure


def test_causes_group_tests_like_the_crash_table() -> None:
    cpu = [_rec(n, "call", "passed") for n in ("m::T::a", "m::T::b", "m::T::c")]
    tpu = [_rec("m::T::a", "call", "failed", error_type="TpuOpError", op="aten::mean.dim",
                message="aten::mean.dim failed on tpu: TypeError: got 3"),
           _rec("m::T::b", "call", "failed", error_type="TpuOpError", op="aten::mean.dim",
                message="aten::mean.dim failed on tpu: TypeError: got 4"),
           _rec("m::T::c", "call", "passed")]
    ct = table.causes(table.build(cpu, tpu))
    assert len(ct) == 1 and ct.iloc[0]["tests"] == 2 and ct.iloc[0]["failing_op"] == "aten::mean.dim"
    assert ct.iloc[0]["outcomes"] == "failed"


def _shared_tests() -> Path | None:
    """../shared/transformers-tests beside the checkout (or further up), as CI and this machine have it."""
    for parent in Path(__file__).resolve().parents:
        cand = parent / "shared" / "transformers-tests"
        if (cand / "tests" / "models").is_dir():
            return cand
    return None


SHARED = _shared_tests()
needs_shared = pytest.mark.skipif(SHARED is None, reason="../shared/transformers-tests (Transformers 5.24.0's tests "
                                  "with bert and gpt2) is not present beside this checkout")


@needs_shared
def test_shared_tests_folder_is_recognised() -> None:
    assert {"bert", "gpt2"} <= set(checkout.available_families(SHARED))
    with pytest.raises(checkout.CheckoutError, match="--transformers-version"):
        checkout.check(SHARED)  # a bare tests/ copy says nothing of its version


@needs_shared
@pytest.mark.slow  # two sessions that import Transformers' test mixins: about a minute
def test_a_bert_test_from_the_shared_folder(tmp_path: Path) -> None:
    pytest.importorskip("parameterized")
    out = tmp_path / "out"
    assert main(["upstream-tests", "--transformers-src", str(SHARED), "--families", "bert", "--transformers-version",
                 checkout.installed_version(), "-k", "test_config or test_model_get_set_embeddings", "--jobs", "1",
                 "--out", str(out)]) == 0
    df = pd.read_csv(out / "upstream.csv")
    assert len(df) >= 2 and set(df["cpu"]) == {"passed"}
    assert set(df["tpu"]) == {"passed"}


# Transformers tests that failed on tpu and were fixed in hf_tpu (issue #12), run as the nightly runs them:
# one tpu session, in order (the static-cache test failed only after the global-device test had run).
FIXED_ON_TPU = {
    "gpt2": ["test_problem_types", "test_training_gradient_checkpointing", "test_resize_tokens_embeddings",
             "test_disk_offload_safetensors", "test_can_load_with_global_device_set",
             "test_generate_with_static_cache"],
    "bert": ["test_resize_tokens_embeddings"],
}


@needs_shared
@pytest.mark.slow  # a tpu session over seven Transformers tests: about two minutes
@pytest.mark.parametrize("family", sorted(FIXED_ON_TPU))
def test_fixed_transformers_tests_pass_on_tpu(tmp_path: Path, family: str) -> None:
    pytest.importorskip("parameterized")
    out = tmp_path / "out"
    keyword = " or ".join(FIXED_ON_TPU[family])
    assert main(["upstream-tests", "--transformers-src", str(SHARED), "--families", family, "--transformers-version",
                 checkout.installed_version(), "-k", keyword, "--devices", "tpu", "--jobs", "1",
                 "--out", str(out)]) == 0
    tpu = table.outcomes(table.read_records(out / "tpu.jsonl"))
    ran = {k.split("::")[-1]: v["outcome"] for k, v in tpu.items()}
    for name in FIXED_ON_TPU[family]:
        assert ran.get(name) == "passed", (name, ran.get(name))
