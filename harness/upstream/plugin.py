"""pytest plugin (`-p harness.upstream.plugin`): one JSON line per test report, written by the pytest-xdist
controller as each report arrives (so a killed run keeps what it has), to the file named by
$HF_TPU_UPSTREAM_RECORDS. The controller also reports the test a crashed worker was running (xdist's
`when == "???"` report), so crashes are recorded too."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from harness.core.errors import _OP_RE, normalise

ENV = "HF_TPU_UPSTREAM_RECORDS"
_TYPE_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def error_of(report: Any) -> dict[str, str]:
    """error_type, message and ATen op of a failed report, from its text (xdist ships reports as text)."""
    text = str(getattr(report, "longreprtext", "") or report.longrepr or "")
    if report.when == "???" or "crashed while running" in text:
        return {"error_type": "WorkerCrash", "message": "the worker process died running this test (e.g. SIGSEGV)",
                "op": ""}
    crash = getattr(report.longrepr, "reprcrash", None)
    msg = str(getattr(crash, "message", "") or "") or next((ln for ln in text.splitlines() if ln.strip()), "")
    m = _TYPE_RE.match(msg)
    if msg.startswith("Failed: Timeout"):
        etype = "Timeout"
    elif msg.startswith("assert "):
        etype = "AssertionError"
    elif m and (m.group(1)[0].isupper() or "." in m.group(1)):  # "pkg.mod.SomeError: ..." or "KeyError"
        etype, msg = m.group(1).rsplit(".", 1)[-1], msg[m.end():].strip()
    else:
        etype = ""
    op = _OP_RE.search(msg) or _OP_RE.search("\n".join(ln for ln in text.splitlines() if ln.startswith("E ")))
    return {"error_type": etype, "message": normalise(msg), "op": op.group(0) if op else ""}


def record_of(report: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                           "xfail": hasattr(report, "wasxfail"), "duration": round(float(report.duration or 0), 3)}
    if report.failed:
        rec.update(error_of(report))
    elif report.skipped and not rec["xfail"]:
        longrepr = report.longrepr
        rec["message"] = normalise(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr))
    return rec


class _Recorder:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole session

    def _write(self, rec: dict[str, Any]) -> None:
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def pytest_runtest_logreport(self, report: Any) -> None:
        self._write(record_of(report))

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:  # a test file that cannot be imported: its tests never run
            self._write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "xfail": False,
                         "duration": 0.0, **error_of(report)})

    def pytest_unconfigure(self, config: Any) -> None:
        self._f.close()


def pytest_configure(config: Any) -> None:
    path = os.environ.get(ENV)
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes
        config.pluginmanager.register(_Recorder(path), "hf_tpu_upstream_recorder")
