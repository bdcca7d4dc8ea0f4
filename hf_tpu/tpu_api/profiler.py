"""torch.tpu.profiler.TpuProfilerConfig: TorchTPU's profiler options as a torch.profiler experimental config
(the same `custom_profiler_config` string torch_tpu builds). On the stand-in there is no TPU tracer: the
config is accepted by torch.profiler.profile(experimental_config=...) and the CPU activity is recorded."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import torch

_STABLE_KEYS = frozenset({"check_experimental_options", "device_tracer_level", "host_tracer_level",
                          "python_tracer_level", "run_dir", "worker_rank"})


def _format(value: int | bool | str) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", r"\\").replace('"', r"\"") + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, int):
        raise TypeError(f"experimental option values are int, bool or str, got {type(value).__name__}")
    return str(value)


def default_run_dir() -> str | None:
    """TORCH_TPU_PROFILER_OUTPUT_DIR: where traces go when no run_dir is given."""
    return os.environ.get("TORCH_TPU_PROFILER_OUTPUT_DIR") or None


class TpuProfilerConfig(torch.profiler._ExperimentalConfig):
    """TPU profiler options: tracer levels, run_dir, worker_rank and experimental options."""

    def __init__(self, *, host_tracer_level: int = 2, device_tracer_level: int = 1, python_tracer_level: int = 0,
                 run_dir: os.PathLike[str] | str | None = None, worker_rank: str | None = None,
                 experimental_options: Mapping[str, int | bool | str] | None = None,
                 check_experimental_options: bool = True) -> None:
        if worker_rank is not None:
            if not isinstance(worker_rank, str):
                raise TypeError(f"worker_rank must be a string, got {type(worker_rank)}")
            if ":" in worker_rank or "," in worker_rank:
                raise ValueError(f"worker_rank string cannot contain ':' or ',': {worker_rank!r}")
        for key in experimental_options or {}:
            if key in _STABLE_KEYS:
                raise ValueError(f"Experimental option key cannot clash with stable option: {key!r}")
            if ":" in key or "," in key:
                raise ValueError(f"Experimental option keys cannot contain ':' or ',': {key!r}")
        run_dir = os.fspath(run_dir) if run_dir is not None else default_run_dir()
        self.run_dir = run_dir
        self.parts = list(self._parts(host_tracer_level, device_tracer_level, python_tracer_level, run_dir,
                                      worker_rank, experimental_options, check_experimental_options))
        super().__init__(custom_profiler_config=",".join(self.parts))

    @staticmethod
    def _parts(host: int, device: int, python: int, run_dir: str | None, worker_rank: str | None,
               experimental: Mapping[str, int | bool | str] | None, check: bool) -> Iterator[str]:
        yield f"host_tracer_level:{host}"
        yield f"device_tracer_level:{device}"
        yield f"python_tracer_level:{python}"
        if run_dir is not None:
            yield f"run_dir:{run_dir}"
        if worker_rank is not None:
            yield f"worker_rank:{_format(worker_rank)}"
        if experimental:
            for key, value in experimental.items():
                yield f"{key}:{_format(value)}"
            yield f"check_experimental_options:{str(check).lower()}"
