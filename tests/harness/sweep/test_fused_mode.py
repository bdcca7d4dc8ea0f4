"""`--modes eager,fused`: the fused eager mode is a sweep mode with its own rows, judged like eager."""

import csv

from sweep_helpers import run_cli, sweep_cmd

from harness.sweep.results import read_csv, validate


def test_fused_mode_rows_match_eager(tmp_path):
    out = tmp_path / "run"
    p = run_cli(*sweep_cmd("--zoo", "smoke", "--match", "llama/LlamaForCausalLM$", "--modes", "eager,fused",
                           "--jobs", "1", "--repeats", "2", "--out", str(out), "--progress", "none"))
    assert p.returncode == 0, p.stderr
    with open(out / "results.csv") as f:
        rows = {r["mode"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"eager", "fused"}
    assert rows["fused"]["status"] == rows["eager"]["status"] == "pass"
    assert validate(read_csv(out / "results.csv")) == []
