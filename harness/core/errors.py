"""Turning an exception (or a dead worker) into the error columns of a row: type, short message, ATen op."""

from __future__ import annotations

import re
import signal

_OP_RE = re.compile(r"aten::[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?")
_OP_ALT_RE = re.compile(r"\baten\.([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?")
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")
_WS_RE = re.compile(r"\s+")
_OOM_RE = re.compile(r"can't allocate memory|out of memory|RESOURCE_EXHAUSTED|std::bad_alloc|Cannot allocate memory", re.I)
MESSAGE_LIMIT = 200


def chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (dynamo wraps the backend's error as `inner_exception`)."""
    seen, out = set(), []
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = getattr(cur, "inner_exception", None) or cur.__cause__ or cur.__context__
    return out


def failing_op(exc: BaseException) -> str:
    """The ATen op named by a missing lowering (`.op` attribute, else `aten::name.overload` in a message)."""
    for e in chain(exc):
        op = getattr(e, "op", None)
        if isinstance(op, str) and op:
            return op
    for e in chain(exc):
        text = str(e)
        m = _OP_RE.search(text)
        if m:
            return m.group(0)
        m = _OP_ALT_RE.search(text)
        if m and isinstance(e, NotImplementedError):
            return f"aten::{m.group(1)}" + (f".{m.group(2)}" if m.group(2) else "")
    return ""


def normalise(message: str) -> str:
    """First non-empty line, addresses blanked, whitespace collapsed, truncated."""
    line = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), "")
    line = _ADDR_RE.sub("0x?", line)
    line = _WS_RE.sub(" ", line)
    return line[:MESSAGE_LIMIT]


def root_cause(exc: BaseException) -> BaseException:
    """The innermost interesting exception: dynamo's BackendCompilerFailed wraps the backend's."""
    inner = getattr(exc, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else exc


def is_oom(exc: BaseException) -> bool:
    return any(isinstance(e, MemoryError) or bool(_OOM_RE.search(str(e))) for e in chain(exc))


def is_compile_error(exc: BaseException) -> bool:
    """torch.compile / XLA compilation raised (as opposed to an error at run time of a compiled graph)."""
    try:
        from torch._dynamo.exc import TorchDynamoException
    except Exception:  # pragma: no cover
        TorchDynamoException = ()  # type: ignore[assignment]
    for e in chain(exc):
        if TorchDynamoException and isinstance(e, TorchDynamoException):
            return True
        mod = type(e).__module__ or ""
        if mod.startswith(("jax", "jaxlib")) and "compil" in str(e).lower():
            return True
    return False


def error_fields(exc: BaseException) -> dict:
    cause = root_cause(exc)
    return {
        "error_type": type(cause).__name__,
        "error_message": normalise(str(cause) or repr(cause)),
        "failing_op": failing_op(exc),
    }


def death_fields(exitcode: int | None, why: str) -> dict:
    """Error columns for a worker that died: `why` is timeout | oom | crash."""
    if why == "timeout":
        return {"error_type": "Timeout", "error_message": "", "failing_op": ""}
    if why == "oom":
        return {"error_type": "MemoryCap", "error_message": "", "failing_op": ""}
    name = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
    return {"error_type": "WorkerCrash", "error_message": f"worker died: {name}", "failing_op": ""}


def fault_frames(log_tail: str, frames: int = 3) -> str:
    """Where a worker was when it died on a signal: the last faulthandler dump in (the tail of) its log, as
    "Segmentation fault in fn (file.py:12) < caller (file.py:40) ..." with the crashing thread's innermost
    `frames` frames (faulthandler lists them most recent first). '' when the log holds no dump."""
    at = log_tail.rfind("Fatal Python error:")
    if at < 0:
        return ""
    dump = log_tail[at:].splitlines()
    what = dump[0][len("Fatal Python error:"):].strip()
    current = next((i for i, line in enumerate(dump) if line.startswith("Current thread")),
                   next((i for i, line in enumerate(dump) if line.startswith("Thread ")), None))
    shown = []
    for line in dump[current + 1:] if current is not None else []:
        m = re.match(r'\s+File "([^"]+)", line (\d+) in (\S+)', line)
        if not m:
            break
        shown.append(f"{m.group(3)} ({m.group(1).rsplit('/', 1)[-1]}:{m.group(2)})")
        if len(shown) == frames:
            break
    return what + (" in " + " < ".join(shown) if shown else "")
