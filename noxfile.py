"""nox sessions: `tests` (CI's fast subset), `lint`, `nightly` (full sweep, compare with expected)."""

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint"]


def _install(session: nox.Session) -> None:
    # torch first and pinned: the CPU build on disk; anything looser may fetch a CUDA build.
    session.install("torch==2.13.0")
    session.install("-e", ".[test]")


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "-m", "not slow", "-n", "2", "--dist", "loadfile", "-q", *session.posargs, env={"HF_HUB_OFFLINE": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "hf_tpu", "harness", "tests")


@nox.session
def nightly(session: nox.Session) -> None:
    """What .github/workflows/nightly.yml does, on one machine: `nox -s nightly -- [RUN_DIR] [SWEEP OPTIONS]`,
    e.g. `nox -s nightly -- reports/nightly --shard 3/40` for one shard (compare holds a shard to its own
    entries only)."""
    _install(session)
    env = {"HF_HUB_OFFLINE": "1"}
    args = list(session.posargs)
    run_dir = args.pop(0) if args and not args[0].startswith("-") else "reports/nightly"
    # each precision has its own accepted statuses: `-- --precision medium` is held to reports/expected-medium,
    # which accepts the whole zoo in eager (compiled at medium: a smoke sample): eager unless --modes is given
    medium = any(a == "--precision=medium" or (a == "--precision" and args[i + 1:i + 2] == ["medium"])
                 for i, a in enumerate(args))
    if medium and not any(a == "--modes" or a.startswith("--modes=") for a in args):
        args += ["--modes", "eager"]
    # both phases at highest, as the workflow (reports/expected accepts the training step too); medium's
    # directory holds inference only
    if not medium and not any(a == "--phases" or a.startswith("--phases=") for a in args):
        args += ["--phases", "inference,train"]
    session.run("hf-tpu", "sweep", "--zoo", "full", "--out", run_dir, *args, env=env)
    expected = ["--expected", "reports/expected-medium"] if medium else []
    # compare first so the dashboard shows each row's class; a regression must not stop the report
    session.run("hf-tpu", "compare", run_dir, *expected, env=env, success_codes=[0, 1])
    session.run("hf-tpu", "report", run_dir, env=env)
    session.run("hf-tpu", "compare", run_dir, "--no-write", *expected, env=env)  # fails on regressions
