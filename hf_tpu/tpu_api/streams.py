"""torch.tpu's streams and events on the stand-in.

hf-tpu runs every tpu op on one JAX dispatch queue, so there is one stream in effect: a Stream's
synchronize (and an Event's record) wait for all queued work, and an Event's time is the host clock at the
moment the queued work before it finished, which is what `elapsed_time` between two events measures.
Written in Python because PyTorch's torch.Stream/torch.Event for PrivateUse1 need C++ hooks (issue 25)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from hf_tpu.tpu_api import device_api


class Stream:
    """A tpu stream (torch_tpu's `torch.tpu.Stream(device=None, priority=0)`)."""

    def __init__(self, device: Any = None, priority: int = 0, stream_id: int = 0, **kwargs: Any) -> None:
        device_api._index(device)
        self.device = torch.device("tpu", 0)
        self.priority = priority
        self.stream_id = stream_id

    def synchronize(self) -> None:
        device_api.synchronize()

    def query(self) -> bool:
        device_api.synchronize()  # hf-tpu cannot ask JAX "done?" without waiting: report it after waiting
        return True

    def wait_stream(self, stream: Stream) -> None:
        pass  # one dispatch queue: work on `stream` is already ordered before work issued after this call

    def wait_event(self, event: Event) -> None:
        event.synchronize()

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("tpu", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device=tpu:0 stream_id={self.stream_id}>"


class Event:
    """A tpu event (torch_tpu's `torch.tpu.Event(enable_timing=False, blocking=False, ...)`)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False, device: Any = None) -> None:
        device_api._index(device)
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        device_api.synchronize()
        self._time = time.perf_counter()

    def query(self) -> bool:
        return self._time is not None

    def synchronize(self) -> None:
        pass  # recording waited for the work before it

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and `end_event` (both recorded, both with enable_timing=True)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("elapsed_time needs events created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event._time - self._time) * 1000.0


_current = Stream()


def current_stream(device: Any = None) -> Stream:
    device_api._index(device)
    return _current


def default_stream(device: Any = None) -> Stream:
    device_api._index(device)
    return Stream(stream_id=0)


def set_stream(stream: Stream) -> None:
    global _current
    if not isinstance(stream, Stream):
        raise TypeError(f"set_stream takes a torch.tpu.Stream, got {type(stream).__name__}")
    _current = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    """Make `stream` current inside the block (None: a no-op, as in torch.cuda.stream)."""
    if stream is None:
        yield
        return
    before = _current
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(before)
