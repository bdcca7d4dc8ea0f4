"""Bad input exits with status 2 and a message naming the problem, before any work."""

import pytest

from harness.cli import main


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--zoo", "nosuchzoo"], "unknown zoo 'nosuchzoo'"),
    (["--zoo", "test", "--match", "(oops"], "bad --match regex"),
    (["--zoo", "test:pass,frobnicate"], "unknown test entry 'frobnicate'"),
    (["--zoo", "test", "--shard", "3/2"], "bad --shard"),
    (["--zoo", "test", "--modes", "eager,jit"], "bad --modes"),
    (["--zoo", "test", "--precision", "low"], "invalid choice"),
    (["--zoo", "test", "--jobs", "0"], "bad --jobs"),
    (["--zoo", "test", "--tolerances", "/nonexistent.yaml"], "no such file"),
    (["--zoo", "test", "--task", "no-such-task"], "no entry of zoo 'test' matches task 'no-such-task'"),
])
def test_bad_input_exits_2(args, message, capsys, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["sweep", *args, "--device", "cpu", "--out", str(out)]))
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (out / "run.json").exists()


def test_malformed_models_list(tmp_path, capsys):
    bad = tmp_path / "models.csv"
    bad.write_text("name,whatever\nfoo,1\n")
    assert main(["sweep", "--zoo", str(bad), "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert "models list" in capsys.readouterr().err


def test_unwritable_output_dir_refused_before_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["sweep", "--zoo", "test", "--device", "cpu", "--out", str(blocker / "sub")]) == 2
    assert "cannot write the output directory" in capsys.readouterr().err


def test_resume_refuses_a_different_selection_and_a_non_run(tmp_path, capsys):
    from harness.sweep.results import ResultStore

    run = tmp_path / "run"
    run.mkdir()
    ResultStore(run).write_run({"run_id": "r", "selection": {"zoo": "test:pass", "modes": ["eager"]}})
    assert main(["sweep", "--resume", "--out", str(run), "--zoo", "test:raise"]) == 2
    assert "differs from the run being resumed" in capsys.readouterr().err
    assert main(["sweep", "--resume", "--out", str(tmp_path / "empty")]) == 2
    assert "not a sweep output directory" in capsys.readouterr().err


def test_existing_results_need_resume(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    (run / "rows" / "x.json").write_text("{}")
    assert main(["sweep", "--zoo", "test", "--device", "cpu", "--out", str(run)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_merge_bad_input(tmp_path, capsys):
    assert main(["merge", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["merge", str(tmp_path / "empty"), "--out", str(tmp_path / "m")]) == 2
    assert "neither results.csv" in capsys.readouterr().err
