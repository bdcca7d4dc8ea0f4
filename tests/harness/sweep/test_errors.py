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


def test_fault_frames_names_the_crashing_threads_innermost_frames():
    log = """noise before
Fatal Python error: Segmentation fault

Thread 0x00007f25645ff6c0 (most recent call first):
  File "/x/threading.py", line 320 in wait

Current thread 0x00007f2582e10b80 (most recent call first):
  File "/w/hf_tpu/graph_compiler.py", line 369 in call
  File "/w/torch/_functorch/runtime_wrappers.py", line 3551 in _backward_impl
  File "/w/torch/autograd/function.py", line 333 in apply_boxed
  File "/w/harness/sweep/train.py", line 213 in one_step

Extension modules: numpy (total: 1)
"""
    assert errors.fault_frames(log) == ("Segmentation fault in call (graph_compiler.py:369) < _backward_impl "
                                        "(runtime_wrappers.py:3551) < apply_boxed (function.py:333)")
    assert errors.fault_frames("no dump here") == ""
