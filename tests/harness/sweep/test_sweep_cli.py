"""The sweep end to end through `hf-tpu sweep`, with the harness's own test entries and the cpu stand-in."""

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sweep_helpers import REPO, run_cli, sweep_cmd

from harness.schema import VOLATILE
from harness.sweep import testzoo
from harness.sweep.results import read_csv, validate


def _rows(out: Path) -> dict:
    with open(out / "results.csv") as f:
        return {(r["entry_id"], r["mode"]): r for r in csv.DictReader(f)}


KINDS = ("pass", "raise", "abort", "sleep", "oom", "perturb", "baseline", "missing")


def test_every_status_from_purpose_built_entries(tmp_path):
    """Each status recorded by isolated, reused workers: a crash, a timeout and the memory cap each cost one
    row and a worker (`compile_fail` is covered in-process by test_runner: it needs no isolation)."""
    out = tmp_path / "run"
    p = run_cli(*sweep_cmd("--zoo", "test:" + ",".join(KINDS), "--modes", "eager", "--device", "cpu", "--jobs", "2",
                           "--timeout", "15", "--memory-cap", "1.2", "--repeats", "1", "--out", str(out),
                           "--progress", "lines"))
    assert p.returncode == 0, p.stderr
    rows = _rows(out)
    assert {k[0]: r["status"] for k, r in rows.items()} == {f"test/{k}": testzoo.EXPECTED_STATUS[k] for k in KINDS}
    # the worker's faulthandler dump names where it died (the test model's forward calls os.abort)
    assert rows[("test/abort", "eager")]["error_message"].startswith("worker died: SIGABRT: Aborted in forward (testzoo.py:")
    assert rows[("test/raise", "eager")]["failing_op"] == "aten::foo.default"
    assert rows[("test/sleep", "eager")]["error_type"] == "Timeout"
    assert rows[("test/oom", "eager")]["error_type"] == "MemoryCap"
    assert validate(read_csv(out / "results.csv")) == []
    for name in ("coverage.md", "crashes.md", "numerics.md", "run.json"):
        assert (out / name).stat().st_size > 0
    cov = (out / "coverage.md").read_text()
    assert "**crash-free**: 33.3% (2/6)" in cov and "**numerics-match**: 50.0% (1/2)" in cov
    assert "## By mode" in cov and "## By task family" in cov and "## By library" in cov
    assert "SIGABRT" in (out / "crashes.md").read_text()
    assert "test/perturb" in (out / "numerics.md").read_text()
    assert "crash-free 33.3% (2/6)" in p.stdout and str(out) in p.stdout
    assert "[8/8]" in p.stderr and "crash=1" in p.stderr  # per-entry progress with live status counts
    workers = len(list((out / "workers").glob("worker-*.log")))
    assert workers >= 4  # two, plus a replacement for each crash/timeout/oom while entries remain


def test_kill_9_then_resume_runs_each_entry_once(tmp_path):
    out, log = tmp_path / "run", tmp_path / "builds.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TPU_SWEEP_TEST_LOG": str(log)}
    args = sweep_cmd("--zoo", "test:slow*10", "--device", "cpu", "--modes", "eager", "--repeats", "1",
                     "--out", str(out), "--progress", "none")
    proc = subprocess.Popen(args, cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows_dir = out / "rows"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(rows_dir.glob("*.json"))) < 3:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the whole sweep, workers included
    proc.wait()
    done_at_kill = {p.name: p.stat().st_mtime_ns for p in rows_dir.glob("*.json")}
    assert 3 <= len(done_at_kill) < 10
    builds_before = log.read_text().splitlines()
    assert not (out / "results.csv").exists()

    p = run_cli(*sweep_cmd("--resume", "--out", str(out), "--progress", "none"), env={"HF_TPU_SWEEP_TEST_LOG": str(log)})
    assert p.returncode == 0, p.stderr
    rows = _rows(out)
    assert sorted(rows) == [(f"test/slow_{i:03d}", "eager") for i in range(10)]
    assert all(r["status"] == "pass" for r in rows.values())
    # entries written before the kill were neither run nor written again
    assert {p.name: p.stat().st_mtime_ns for p in rows_dir.glob("*.json") if p.name in done_at_kill} == done_at_kill
    import json

    done_ids = {json.loads((rows_dir / n).read_text())["entry_id"] for n in done_at_kill}
    builds_after = [ln.split()[0] for ln in log.read_text().splitlines()[len(builds_before):]]
    assert not done_ids & set(builds_after)
    assert sorted(builds_after) == sorted(set(builds_after))  # each remaining entry ran once
    assert set(builds_after) | done_ids == {f"test/slow_{i:03d}" for i in range(10)}
    assert f"{len(done_at_kill)} entries already written" in p.stdout


def test_shards_merged_equal_a_single_run(tmp_path):
    """Sharding and merging are the driver's business, whatever the executor: in-process (inline) for speed."""
    from harness.cli import main

    zoo = "test:pass*3,perturb,raise,baseline,missing,compile"
    common = ["sweep", "--zoo", zoo, "--device", "cpu", "--repeats", "1", "--progress", "none", "--executor", "inline"]
    for i in (1, 2):
        assert main([*common, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    assert main([*common, "--out", str(tmp_path / "single")]) == 0
    s1, s2 = _rows(tmp_path / "s1"), _rows(tmp_path / "s2")
    assert s1 and s2 and not set(s1) & set(s2)
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "merged")]) == 0
    merged, one = _rows(tmp_path / "merged"), _rows(tmp_path / "single")
    assert sorted(merged) == sorted(one)
    for key in one:  # measurements (times, peak memory, compile counts) are not results: they may differ
        assert {k: v for k, v in merged[key].items() if k not in VOLATILE} == \
               {k: v for k, v in one[key].items() if k not in VOLATILE}, key
    results = [(tmp_path / d / "coverage.md").read_text().split("\n", 1)[1] for d in ("merged", "single")]
    assert all("## Performance" in md for md in results)  # measured, so not compared
    assert results[0].split("## Performance")[0] == results[1].split("## Performance")[0]


def test_resume_retry_runs_the_entries_of_those_statuses_again(tmp_path, monkeypatch):
    """`--resume --retry timeout` (an entry that timed out on a loaded machine): those entries run again and
    their rows are replaced; every other entry is left as written."""
    from harness.cli import main

    log = tmp_path / "builds.log"
    monkeypatch.setenv("HF_TPU_SWEEP_TEST_LOG", str(log))
    out = tmp_path / "run"
    common = ["--device", "cpu", "--repeats", "1", "--progress", "none", "--executor", "inline", "--out", str(out)]
    assert main(["sweep", "--zoo", "test:pass*2,raise,perturb", "--modes", "eager", *common]) == 0
    assert main(["sweep", "--resume", "--retry", "fail_to_run", *common]) == 0
    builds = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert sorted(builds) == ["test/pass_000", "test/pass_001", "test/perturb", "test/raise", "test/raise"]
    assert {k[0]: r["status"] for k, r in _rows(out).items()} == {
        "test/pass_000": "pass", "test/pass_001": "pass", "test/raise": "fail_to_run", "test/perturb": "fail_accuracy"}
    assert main(["sweep", "--retry", "timeout", "--zoo", "test:pass", "--out", str(tmp_path / "x")]) == 2
    assert main(["sweep", "--resume", "--retry", "timout", *common]) == 2


@pytest.mark.slow
def test_ray_executor_runs_entries_as_ray_tasks(tmp_path):
    pytest.importorskip("ray", reason="the ray executor needs the optional extra: pip install -e '.[ray]'")
    out = tmp_path / "run"
    p = run_cli(*sweep_cmd("--zoo", "test:pass*2,abort,perturb", "--device", "cpu", "--modes", "eager",
                           "--executor", "ray", "--jobs", "2", "--repeats", "1", "--out", str(out), "--progress", "lines"),
                timeout=300)
    assert p.returncode == 0, p.stderr
    rows = _rows(out)
    assert {k[0]: r["status"] for k, r in rows.items()} == {
        "test/pass_000": "pass", "test/pass_001": "pass", "test/abort": "crash", "test/perturb": "fail_accuracy"}
