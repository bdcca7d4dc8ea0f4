"""Sweep timings (harness/sweep/timings.py): per-phase clock, the timings file kept with the caches, and
the longest-first order of the next sweep."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from harness.sweep import timings


@dataclass(frozen=True)
class E:
    id: str


def test_longest_first_puts_unknown_entries_first_then_by_time() -> None:
    entries = [E("a"), E("b"), E("c"), E("d")]
    order = timings.longest_first(entries, {"a": 1.0, "b": 30.0, "d": 5.0})
    assert [e.id for e in order] == ["c", "b", "d", "a"]
    assert [e.id for e in timings.longest_first(entries, {})] == ["a", "b", "c", "d"]  # no timings: as given


def test_save_merges_per_modes_and_load_reads_back(tmp_path) -> None:
    path = tmp_path / "t.json"
    timings.save(("eager", "compiled"), {"a": 1.234}, path)
    timings.save(("compiled", "eager"), {"b": 2.0}, path)  # same modes, other order
    timings.save(("eager",), {"a": 9.0}, path)
    assert timings.load(("eager", "compiled"), path) == {"a": 1.23, "b": 2.0}
    assert timings.load(("eager",), path) == {"a": 9.0}
    assert timings.load(("compiled",), path) == {}


def test_unreadable_timings_are_ignored(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{not json")
    assert timings.load(("eager",), path) == {}
    timings.save(("eager",), {"a": 1.0}, path)  # a corrupt file is replaced, not a crash
    assert json.loads(path.read_text()) == {"eager": {"a": 1.0}}


def test_timings_path_follows_the_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(timings.ENV, raising=False)
    monkeypatch.setenv("HF_TPU_CACHE_DIR", str(tmp_path))
    assert timings.timings_path() == tmp_path / "sweep-timings.json"
    monkeypatch.setenv(timings.ENV, str(tmp_path / "x.json"))
    assert timings.timings_path() == tmp_path / "x.json"


def test_phase_clock_sums_each_phase() -> None:
    clock = timings.PhaseClock()
    clock.phase("e", "build")
    time.sleep(0.02)
    clock.phase("e", "eager")
    clock.phase("e", "eager")  # repeated message: same phase
    time.sleep(0.03)
    clock.cpu_start("e", 10.0)
    clock.cpu_stop("e", 12.5)
    out = clock.finish("e")
    assert set(out) == {"build", "eager", "cpu"}
    assert 0.015 <= out["build"] < 0.5 and 0.025 <= out["eager"] < 0.5 and out["cpu"] == 2.5
    assert clock.finish("other") == {}


def test_phase_clock_sums_cpu_seconds_per_phase() -> None:
    clock = timings.PhaseClock()
    clock.phase("e", "build", 1.0)
    clock.phase("e", "baseline", 1.5)
    clock.phase("e", "eager", 2.0)
    clock.phase("e", "compiled", 5.0)
    clock.phase("e", "eager", 9.0)  # a continuation after a death: the phase adds up
    out = clock.finish("e", 9.25)
    assert set(out) == {"build", "baseline", "eager", "compiled"}
    assert clock.cpu_phases.pop("e") == {"build": 0.5, "baseline": 0.5, "eager": 3.25, "compiled": 4.0}
    clock.phase("f", "build")  # no CPU figures (a Ray worker): wall-clock phases only
    clock.finish("f")
    assert "f" not in clock.cpu_phases


@pytest.mark.slow  # two real sweeps (~1 min on a quiet machine)
def test_a_sweep_records_phases_and_the_next_runs_longest_first(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    store = tmp_path / "timings.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", timings.ENV: str(store),
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}

    def sweep(out: str) -> list[dict]:
        cmd = [sys.executable, "-m", "harness", "sweep", "--zoo", "test:slow*3", "--device", "cpu", "--modes",
               "eager", "--repeats", "1", "--jobs", "1", "--out", str(tmp_path / out), "--progress", "none"]
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return [json.loads(x) for x in (tmp_path / out / "timings.jsonl").read_text().splitlines()]

    first = sweep("a")
    assert [r["entry_id"] for r in first] == ["test/slow_000", "test/slow_001", "test/slow_002"]  # by id
    for r in first:
        assert {"build", "baseline", "eager", "cpu"} <= set(r["phases"]) and r["seconds"] > 0
    saved = timings.load(("eager",), store)
    assert set(saved) == {r["entry_id"] for r in first}
    # pretend slow_001 was the long one: the next sweep starts with it
    timings.save(("eager",), {"test/slow_001": 100.0, "test/slow_000": 50.0, "test/slow_002": 1.0}, store)
    second = sweep("b")
    assert [r["entry_id"] for r in second] == ["test/slow_001", "test/slow_000", "test/slow_002"]
