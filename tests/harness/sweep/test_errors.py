import torch

from harness.core import errors


def test_failing_op_from_attribute_message_and_chain():
    e = NotImplementedError("whatever")
    e.op = "aten::bar.Tensor"
    assert errors.failing_op(e) == "aten::bar.Tensor"
    assert errors.failing_op(RuntimeError("no lowering for aten::_foo.out here")) == "aten::_foo.out"
    inner = NotImplementedError("aten::cumsum.default has no lowering")
    try:
        try:
            raise inner
        except NotImplementedError as x:
            raise RuntimeError("backend failed") from x
    except RuntimeError as outer:
        assert errors.failing_op(outer) == "aten::cumsum.default"
    assert errors.failing_op(ValueError("plain")) == ""


def test_backend_compiler_failed_is_a_compile_error_and_unwrapped():
    from torch._dynamo.exc import BackendCompilerFailed

    inner = NotImplementedError("aten::cosh.default")
    exc = BackendCompilerFailed(lambda gm, ex: gm, inner, None)
    assert errors.is_compile_error(exc)
    f = errors.error_fields(exc)
    assert f["error_type"] == "NotImplementedError" and f["failing_op"] == "aten::cosh.default"
    assert not errors.is_compile_error(RuntimeError("x"))


def test_normalise_and_oom():
    assert errors.normalise("\n  first   line at 0xdeadbeef\nsecond") == "first line at 0x?"
    assert len(errors.normalise("x" * 1000)) == errors.MESSAGE_LIMIT
    assert errors.is_oom(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory"))
    assert errors.is_oom(MemoryError())
    assert not errors.is_oom(RuntimeError("shape mismatch"))


def test_death_fields_name_the_signal():
    assert errors.death_fields(-6, "crash")["error_message"] == "worker died: SIGABRT"
    assert errors.death_fields(-11, "crash")["error_message"] == "worker died: SIGSEGV"
    assert errors.death_fields(3, "crash")["error_message"] == "worker died: exit code 3"
    assert errors.death_fields(-9, "timeout")["error_type"] == "Timeout"
    assert torch is not None
