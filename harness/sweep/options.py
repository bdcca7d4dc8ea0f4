"""Sweep options: one picklable record shared by the parent, the workers and Ray tasks."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from harness import schema

# Options that fix WHICH rows a run produces; `--resume` refuses to change them.
SELECTION_FIELDS = ("zoo", "modes", "phases", "precision", "dtype", "baseline", "device", "library", "task", "match",
                    "shard", "seed", "hub_layers", "limit")


def default_memory_cap_gb(jobs: int) -> float:
    try:
        import psutil

        total = psutil.virtual_memory().total / 2**30
    except Exception:  # noqa: BLE001
        total = 16.0
    return round(max(2.0, min(8.0, 0.8 * total / max(1, jobs))), 1)


@dataclass
class SweepOptions:
    zoo: str = "smoke"
    modes: tuple[str, ...] = schema.DEFAULT_MODES
    phases: tuple[str, ...] = schema.DEFAULT_PHASES  # inference and/or train (harness/sweep/train.py)
    train_steps: int = 3  # AdamW steps per train row, compared step by step with CPU
    precision: str = "highest"
    dtype: str = "float32"
    baseline: str = "cpu"
    device: str = "tpu"
    library: str | None = None
    task: str | None = None
    match: str | None = None
    shard: tuple[int, int] = (1, 1)  # 1-based (i, N)
    seed: int = 0
    hub_layers: int = 2
    limit: int | None = None
    jobs: int = 1
    timeout: float = 300.0  # seconds per entry phase: build + CPU runs, then each mode
    memory_cap_gb: float = 0.0  # 0: default_memory_cap_gb(jobs); negative: no cap
    repeats: int = 3  # steady-state calls per mode (fewer when calls are slow)
    max_entries_per_worker: int = 100
    executor: str = "local"
    ray_address: str | None = None
    tolerances: str | None = None
    out: str = ""
    run_id: str = ""
    resume: bool = False
    retry: tuple[str, ...] = ()  # with resume: statuses whose entries run again
    progress: str = "auto"
    diagnose: bool = False  # locate each failing row's module and op, write a repro (harness.diagnose)
    canary: str | None = None  # fault spec (harness.sweep.canary): rerun each passing row with it injected
    env: dict = field(default_factory=dict)  # extra environment for workers

    def selection(self) -> dict:
        d = asdict(self)
        return {k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in SELECTION_FIELDS}

    def memory_cap_bytes(self) -> int | None:
        cap = self.memory_cap_gb or default_memory_cap_gb(self.jobs)
        return None if cap < 0 else int(cap * 2**30)

    def worker_env(self) -> dict:
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_DATASETS_OFFLINE": "1"}
        if self.device == "cpu":
            env["HF_TPU_DISABLE"] = "1"  # the cpu stand-in needs no device: skip hf_tpu's autoload and JAX
        env.update(self.env)
        return env


def worker_threads(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, jobs))
