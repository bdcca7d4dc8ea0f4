"""upstream.csv (one row per test: both devices' outcomes and the tpu failure's type, message and ATen op) and
the table of cpu-pass/tpu-fail tests by root cause, grouped as the sweep's crash table is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.ci.coverage import crash_table
from harness.core.tables import Figure, md_cell

COLUMNS = ["test", "family", "cpu", "tpu", "tpu_error_type", "tpu_message", "tpu_op", "cpu_error_type",
           "cpu_message", "tpu_duration_s"]
FAILED = ("failed", "error", "crashed", "timeout")
CAUSE_COLUMNS = ["tests", "failing_op", "error_type", "message", "outcomes", "examples"]

# how a run failure shows in the sweep's crash table, for reusing its grouping
_STATUS = {"failed": "fail_to_run", "error": "fail_to_run", "crashed": "crash", "timeout": "timeout"}


def read_records(path: Path) -> list[dict[str, Any]]:
    """The plugin's records; a line cut short by a killed run is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def outcomes(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per test: its outcome over the setup/call/teardown reports (passed, failed, error, crashed, timeout,
    skipped, xfailed, xpassed) and the failure's fields. A test reported again (a re-run) keeps the last."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        nodeid = r["nodeid"]
        if r.get("when") in ("setup", "collect") or nodeid not in out:
            out[nodeid] = {"outcome": "passed", "duration": 0.0}  # a setup report starts a test's run
        cur = out[nodeid]
        cur["duration"] = cur.get("duration", 0.0) + float(r.get("duration") or 0)
        if cur["outcome"] in FAILED:
            continue  # the first failure is the cause; a teardown error after it adds nothing
        if r["outcome"] == "failed":
            if r.get("xfail"):
                cur["outcome"] = "xfailed"
                continue
            kind = {"WorkerCrash": "crashed", "Timeout": "timeout"}.get(r.get("error_type", ""))
            cur["outcome"] = kind or ("failed" if r.get("when") == "call" else "error")
            cur.update({k: r.get(k, "") for k in ("error_type", "message", "op")})
        elif r["outcome"] == "skipped":
            cur["outcome"] = "xfailed" if r.get("xfail") else "skipped"
            cur["message"] = r.get("message", "")
        elif r["outcome"] == "passed" and r.get("when") == "call" and r.get("xfail"):
            cur["outcome"] = "xpassed"
    return out


def _family(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[parts.index("models") + 1] if "models" in parts[:-1] else parts[-1].removesuffix(".py")


def build(cpu: list[dict[str, Any]], tpu: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per test seen on either device; `missing` where a device has no result for it."""
    c, t = outcomes(cpu), outcomes(tpu)
    rows = []
    for test in sorted(set(c) | set(t)):
        co, to = c.get(test, {"outcome": "missing"}), t.get(test, {"outcome": "missing"})
        failed = to["outcome"] in FAILED
        rows.append({
            "test": test, "family": _family(test), "cpu": co["outcome"], "tpu": to["outcome"],
            "tpu_error_type": to.get("error_type", "") if failed else "",
            "tpu_message": to.get("message", "") if failed else "",
            "tpu_op": to.get("op", "") if failed else "",
            "cpu_error_type": co.get("error_type", "") if co["outcome"] in FAILED else "",
            "cpu_message": co.get("message", "") if co["outcome"] in FAILED else "",
            "tpu_duration_s": round(to.get("duration", 0.0), 3) if to["outcome"] != "missing" else None,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def share(df: pd.DataFrame) -> Figure:
    """Of the tests that pass on CPU and ran on tpu, how many pass on tpu."""
    base = df[(df["cpu"] == "passed") & (df["tpu"] != "missing")]
    return Figure(int((base["tpu"] == "passed").sum()), len(base))


def regressions(df: pd.DataFrame) -> pd.DataFrame:
    """Tests that pass on CPU and fail, error, crash or time out on tpu."""
    return df[(df["cpu"] == "passed") & df["tpu"].isin(FAILED)]


def causes(df: pd.DataFrame, examples: int = 3) -> pd.DataFrame:
    """The cpu-pass/tpu-fail tests grouped by root cause (ATen op, error type, normalised message), most
    tests first: harness.ci.coverage.crash_table over the tests as rows."""
    r = regressions(df)
    if r.empty:
        return pd.DataFrame(columns=CAUSE_COLUMNS)
    rows = pd.DataFrame({"entry_id": r["test"].map(lambda s: s.split("::", 1)[-1]), "mode": "eager",
                         "status": r["tpu"].map(_STATUS), "error_type": r["tpu_error_type"],
                         "error_message": r["tpu_message"], "failing_op": r["tpu_op"]})
    t = crash_table(rows, examples=examples)
    inv = {v: k for k, v in _STATUS.items() if k != "error"}
    return pd.DataFrame({"tests": t["entries"], "failing_op": t["failing_op"], "error_type": t["error_type"],
                         "message": t["message"],
                         "outcomes": t["statuses"].map(lambda s: ", ".join(inv.get(x, x) for x in s.split(", "))),
                         "examples": t["examples"]}, columns=CAUSE_COLUMNS)


def counts(df: pd.DataFrame, device: str) -> dict[str, int]:
    return {k: int(v) for k, v in df[device].value_counts().items()}


def markdown(df: pd.DataFrame, title: str = "Transformers' model tests on tpu") -> str:
    fig = share(df)
    lines = [f"# {title}", "",
             f"- **CPU-passing tests that pass on tpu**: {fig}",
             f"- tests: {len(df)}; cpu: {counts(df, 'cpu')}; tpu: {counts(df, 'tpu')}", ""]
    fams = sorted(df["family"].unique())
    if len(fams) > 1:
        lines += ["| family | pass on tpu / pass on cpu |", "|---|---:|"]
        lines += [f"| {f} | {share(df[df['family'] == f])} |" for f in fams]
        lines.append("")
    ct = causes(df)
    lines += [f"## CPU-pass, tpu-fail tests by root cause ({len(regressions(df))} tests, {len(ct)} causes)", ""]
    if ct.empty:
        lines.append("None.")
    else:
        lines += ["| tests | failing op | error | message | outcomes | examples |", "|---:|---|---|---|---|---|"]
        for _, r in ct.iterrows():
            lines.append(f"| {r['tests']} | {md_cell(r['failing_op'])} | {md_cell(r['error_type'])} "
                         f"| {md_cell(r['message'])} | {r['outcomes']} | {md_cell(r['examples'])} |")
    return "\n".join(lines) + "\n"


def write(out: Path, df: pd.DataFrame) -> None:
    df.to_csv(out / "upstream.csv", index=False)
    (out / "upstream.md").write_text(markdown(df), encoding="utf-8")
