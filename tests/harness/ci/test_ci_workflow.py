"""The nightly workflow parses, and every `hf-tpu` command it (and `nox -s nightly`) runs exists with the
flags given: a renamed subcommand or option must break this test, not the 2 a.m. run."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

from harness import cli

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
NOXFILE = ROOT / "noxfile.py"
SUBCOMMANDS = {name: mod for name, mod, _ in cli.COMMANDS}
_SHELL_OPS = {"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "2>&1"}


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _on(wf: dict) -> dict:
    # YAML 1.1 reads the bare key `on` as True.
    return wf.get("on", wf.get(True)) or {}


def _run_scripts(wf: dict) -> list[tuple[str, str]]:
    out = []
    for job_name, job in wf["jobs"].items():
        for step in job.get("steps", []):
            if "run" in step:
                out.append((f"{job_name}: {step.get('name', step['run'][:40])}", step["run"]))
    return out


def hf_tpu_calls(script: str) -> list[list[str]]:
    """Argument lists of every `hf-tpu ...` command in a shell script. GitHub expressions become `X`,
    shell variables stay as words; both then pass for any argument value. An expression naming an input with
    choices (precision) becomes its default, so the parser's own check of the choice still runs."""
    script = re.sub(r"\$\{\{[^}]*inputs\.precision[^}]*\}\}", "highest", script)
    script = re.sub(r"\$\{\{.*?\}\}", "X", script)
    script = script.replace("\\\n", " ")
    calls = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if "hf-tpu" not in line:
            continue
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        toks = list(lex)
        for i, t in enumerate(toks):
            if t == "hf-tpu" and (i == 0 or toks[i - 1] in _SHELL_OPS or toks[i - 1] in {"then", "do", "exec"}):
                args = []
                for a in toks[i + 1 :]:
                    if a in _SHELL_OPS:
                        break
                    args.append(a)
                calls.append(args)
    return calls


def _nox_nightly_calls() -> list[list[str]]:
    """`session.run("hf-tpu", ...)` calls in noxfile.py's nightly session, variables as `X`."""
    tree = ast.parse(NOXFILE.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "nightly")
    calls = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run" and node.args:
            # *args are the user's pass-through sweep options (`nox -s nightly -- DIR --shard 3/40`): not checked
            args = [a.value if isinstance(a, ast.Constant) else "X" for a in node.args if not isinstance(a, ast.Starred)]
            if args[0] == "hf-tpu":
                calls.append([str(a) for a in args[1:]])
    return calls


def check_call(args: list[str]) -> bool:
    """Parse `hf-tpu ARGS` with the real dispatcher: the subcommand must be in cli.COMMANDS and, when its
    module exists, argparse must accept the arguments (unknown flags, missing values fail). Returns False
    when the module is not built yet, so only COMMANDS could be checked."""
    assert args, "bare `hf-tpu` call"
    sub = args[0]
    assert sub in SUBCOMMANDS, f"`hf-tpu {sub}` is not a subcommand (harness/cli.py COMMANDS: {sorted(SUBCOMMANDS)})"
    if not _importable(SUBCOMMANDS[sub]):
        return False
    parser, _ = cli.build_parser(args)
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"`hf-tpu {' '.join(args)}` is rejected by its parser (exit {exc.code})") from None
    return True


def _importable(modname: str) -> bool:
    try:
        return importlib.util.find_spec(modname) is not None
    except ModuleNotFoundError:
        return False


def test_workflow_parses_with_triggers_matrix_and_artifacts() -> None:
    wf = _workflow()
    on = _on(wf)
    assert "workflow_dispatch" in on
    assert on["schedule"] and all("cron" in s for s in on["schedule"])
    sweep, merge = wf["jobs"]["sweep"], wf["jobs"]["merge"]
    shards = sweep["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)), "shards are 1-based and contiguous"
    assert merge["needs"] == "sweep" or "sweep" in merge["needs"]
    # The N of --shard i/N must equal the matrix size, or entries silently go unswept.
    sweep_calls = [c for _, s in _run_scripts({"jobs": {"sweep": sweep}}) for c in hf_tpu_calls(s) if c[0] == "sweep"]
    assert sweep_calls, "the sweep job runs no `hf-tpu sweep`"
    for c in sweep_calls:
        assert "--zoo" in c and c[c.index("--zoo") + 1] == "full"
        shard = c[c.index("--shard") + 1]
        assert shard.endswith(f"/{len(shards)}"), f"--shard {shard} does not match {len(shards)} matrix entries"
    uploaded = "\n".join(
        str(step.get("with", {}).get("path", ""))
        for step in merge["steps"]
        if str(step.get("uses", "")).startswith("actions/upload-artifact")
    )
    for f in ("results.csv", "dashboard.html", "comparison.csv", "comparison.md"):
        assert f in uploaded, f"{f} is not uploaded as an artifact"
    for job in wf["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert re.search(r"@v\d+", step["uses"]), f"unpinned action {step['uses']}"


def test_workflow_installs_pinned_torch_first() -> None:
    for job in _workflow()["jobs"].values():
        script = "\n".join(s["run"] for s in job["steps"] if "run" in s)
        torch_at = script.find("pip install torch==2.13.0")
        assert torch_at >= 0, "torch is not installed pinned"
        assert torch_at < script.find("pip install -e '.[test]'"), "torch must be installed before the project"


def test_workflow_runs_each_pipeline_stage() -> None:
    subs = [c[0] for _, s in _run_scripts(_workflow()) for c in hf_tpu_calls(s)]
    for needed in ("sweep", "merge", "compare", "report"):
        assert needed in subs, f"the workflow never runs `hf-tpu {needed}`"


@pytest.mark.parametrize(
    "where,args",
    [(w, c) for w, s in _run_scripts(_workflow()) for c in hf_tpu_calls(s)]
    + [("noxfile.py nightly", c) for c in _nox_nightly_calls()],
    ids=lambda v: v if isinstance(v, str) else " ".join(v[:1]),
)
def test_each_hf_tpu_call_exists(where: str, args: list[str]) -> None:
    if not check_call(args):
        pytest.skip(f"{SUBCOMMANDS[args[0]]} is not built yet: only checked that `{args[0]}` is in COMMANDS")


def test_checker_catches_bad_calls() -> None:
    # The checker itself must fail on a wrong subcommand and on a wrong flag of a built subcommand.
    with pytest.raises(AssertionError, match="not a subcommand"):
        check_call(["comapre", "reports/nightly"])
    with pytest.raises(AssertionError, match="rejected"):
        check_call(["compare", "reports/nightly", "--accept-improvement-typo"])
    with pytest.raises(AssertionError, match="rejected"):
        check_call(["report", "--out", "x.html"])  # no RUN
    assert hf_tpu_calls('set +e\nhf-tpu compare r --expected "e d" && echo ok # hf-tpu nope\n') == [
        ["compare", "r", "--expected", "e d"]
    ]


def test_every_phase_the_nightly_sweeps_is_accepted_for_the_whole_zoo() -> None:
    """The nightly at highest sweeps both phases and is compared with reports/expected: each (phase, mode) it
    sweeps has an accepted status for every entry the inference files accept, or the comparison would report
    a thousand rows as new instead of guarding them."""
    import pandas as pd

    (call,) = [c for _, s in _run_scripts({"jobs": {"sweep": _workflow()["jobs"]["sweep"]}}) for c in hf_tpu_calls(s)
               if c[0] == "sweep"]
    assert "--phases" in call, "the nightly sweeps inference only"
    # the workflow reads the phases from a step variable: inference,train at highest, inference at medium
    step = next(st for st in _workflow()["jobs"]["sweep"]["steps"] if "hf-tpu sweep" in str(st.get("run", "")))
    phases = re.search(r"\|\| '([a-z,]+)'", step["env"]["PHASES"]).group(1).split(",")
    assert phases == ["inference", "train"]
    modes = re.search(r"\|\| '([a-z,]+)'", step["env"]["MODES"]).group(1).split(",")
    expected = ROOT / "reports" / "expected"
    for mode in modes:
        owed = set(pd.read_csv(expected / f"{mode}.csv")["name"])
        accepted = set(pd.read_csv(expected / f"train-{mode}.csv")["name"])
        missing = sorted(owed - accepted)
        assert not missing, f"train-{mode}.csv accepts no status for {len(missing)} entries, e.g. {missing[:3]}"
