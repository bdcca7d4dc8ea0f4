"""The expected results in `reports/expected/`: accepted status per entry, phase and mode, plus a flaky list.

Layout (see reports/expected/README.md), after PyTorch's benchmarks/dynamo/ci_expected_accuracy:

    <mode>.csv        name,status             the inference phase: one row per zoo entry, sorted by name; mode
                                              is one of schema.MODES
    train-<mode>.csv  name,status             the train phase (harness/sweep/train.py), the same way
    flaky.csv         name,mode,reason[,phase]  entries whose status may change run to run; empty mode = every
                                              mode, empty or absent phase = every phase
    configuration.json                        {"precision": ..., "dtype": ...} the statuses hold for (absent:
                                              the default sweep, highest/float32); compare refuses another one

`accept` rewrites the files of the (phase, mode) pairs a run has and never touches flaky.csv (a human curates
that list).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import schema
from harness.ci._io import atomic_write_text
from harness.ci.runs import InputError, Run

DEFAULT_DIR = Path("reports/expected")
FLAKY = "flaky.csv"
EXPECTED_COLUMNS = ["name", "status"]
FLAKY_COLUMNS = ["name", "mode", "reason"]
CONFIGURATION = "configuration.json"
CONFIG_KEYS = ("precision", "dtype")
DEFAULT_CONFIGURATION = {"precision": "highest", "dtype": "float32"}


def configuration(expected_dir: str | Path) -> dict[str, str]:
    """The sweep configuration an expected-results directory describes."""
    import json

    p = Path(expected_dir) / CONFIGURATION
    if not p.exists():
        return dict(DEFAULT_CONFIGURATION)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{p} is not valid JSON ({exc}); fix it or delete it (then: {DEFAULT_CONFIGURATION})") \
            from None
    return {k: str(data.get(k, DEFAULT_CONFIGURATION[k])) for k in CONFIG_KEYS}


def run_configuration(run: Run) -> dict[str, str]:
    """{precision, dtype} of a run; InputError when its rows mix configurations (compare them one by one)."""
    out = {}
    for k in CONFIG_KEYS:
        values = sorted({str(v) for v in run.df[k].dropna() if str(v)}) if k in run.df else []
        if len(values) > 1:
            raise InputError(f"{run.path}/results.csv mixes {k} values {values}; compare or accept each "
                             f"configuration's run on its own")
        out[k] = values[0] if values else DEFAULT_CONFIGURATION[k]
    return out


def check_configuration(run: Run, expected_dir: str | Path) -> None:
    """A run at "medium" held to statuses accepted at "highest" would report rounding as regressions (and
    the reverse would hide them): refuse, naming the directory that fits."""
    mine, theirs = run_configuration(run), configuration(expected_dir)
    if mine != theirs:
        raise InputError(
            f"{run.path} ran at precision {mine['precision']}, dtype {mine['dtype']} but {expected_dir} holds "
            f"results for precision {theirs['precision']}, dtype {theirs['dtype']}; pass the expected directory "
            f"of that configuration with --expected DIR (e.g. reports/expected-medium for --precision medium), "
            f"or create one with `hf-tpu accept RUN --expected DIR`")


@dataclass
class Expected:
    """Accepted statuses keyed by (entry_id, phase, mode), and the flaky (entry_id, phase, mode) triples."""

    path: Path
    status: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # entry_id -> {(phase, mode): reason}; "" means every phase / every mode.
    flaky: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)

    def _flaky_key(self, entry_id: str, mode: str, phase: str) -> tuple[str, str] | None:
        listed = self.flaky.get(entry_id, {})
        for key in ((phase, mode), ("", mode), (phase, ""), ("", "")):
            if key in listed:
                return key
        return None

    def is_flaky(self, entry_id: str, mode: str, phase: str = "inference") -> bool:
        return self._flaky_key(entry_id, mode, phase) is not None

    def flaky_reason(self, entry_id: str, mode: str, phase: str = "inference") -> str:
        key = self._flaky_key(entry_id, mode, phase)
        return "" if key is None else self.flaky[entry_id][key]


def mode_file(expected_dir: Path, mode: str, phase: str = "inference") -> Path:
    """<mode>.csv for the inference phase (the files before there were phases), <phase>-<mode>.csv otherwise."""
    return expected_dir / (f"{mode}.csv" if phase == "inference" else f"{phase}-{mode}.csv")


def expected_files() -> list[tuple[str, str]]:
    """Every (phase, mode) an expected-results directory may hold a file for."""
    return [(ph, m) for ph in schema.PHASES for m in schema.MODES]


def load_expected(expected_dir: str | Path = DEFAULT_DIR) -> Expected:
    """Read every <mode>.csv and flaky.csv; raise InputError if there is nothing to compare against."""
    d = Path(expected_dir)
    if not d.is_dir():
        raise InputError(
            f"expected-results directory {d} does not exist; create it from a full sweep with "
            f"`hf-tpu accept RUN --expected {d}`, or pass --expected DIR"
        )
    exp = Expected(path=d)
    found = False
    for phase, mode in expected_files():
        p = mode_file(d, mode, phase)
        if not p.exists():
            continue
        found = True
        df = _read_csv(p, EXPECTED_COLUMNS)
        bad = sorted(set(df["status"]) - set(schema.STATUSES))
        if bad:
            raise InputError(
                f"{p} has unknown status value(s) {', '.join(map(repr, bad))}; valid statuses are "
                f"{', '.join(schema.STATUSES)} - fix the file or regenerate it with `hf-tpu accept RUN`"
            )
        dup = df["name"][df["name"].duplicated()]
        if len(dup):
            raise InputError(f"{p} lists {dup.iloc[0]!r} more than once; keep one row per entry")
        for name, status in zip(df["name"], df["status"], strict=True):
            exp.status[(name, phase, mode)] = status
    if not found:
        raise InputError(
            f"{d} holds no expected results ({', '.join(f'{m}.csv' for m in schema.MODES)}, or train-<mode>.csv); "
            f"create them from "
            f"a full sweep with `hf-tpu accept RUN --expected {d}`"
        )
    fp = d / FLAKY
    if fp.exists():
        df = _read_csv(fp, ["name"])
        for c in ("mode", "reason", "phase"):
            if c not in df.columns:
                df[c] = ""
        for col, known in (("mode", schema.MODES), ("phase", schema.PHASES)):
            bad = sorted(set(df[col]) - set(known) - {""})
            if bad:
                raise InputError(
                    f"{fp} has unknown {col} value(s) {', '.join(map(repr, bad))}; use one of "
                    f"{', '.join(known)}, or leave {col} empty for every {col}"
                )
        for name, mode, reason, phase in zip(df["name"], df["mode"], df["reason"], df["phase"], strict=True):
            exp.flaky.setdefault(name, {})[(phase, mode)] = reason
    return exp


def _read_csv(p: Path, required: list[str]) -> pd.DataFrame:
    try:
        # Whole-line `#` comments only: a `#` inside a flaky reason is text.
        text = "".join(line for line in p.read_text(encoding="utf-8").splitlines(True) if not line.lstrip().startswith("#"))
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[])
    except pd.errors.EmptyDataError:
        return pd.DataFrame({c: pd.Series([], dtype=str) for c in required})
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(f"{p} is not a valid CSV ({str(exc).strip().splitlines()[0]}); fix or regenerate it") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(
            f"{p} lacks column(s) {', '.join(missing)} (expected header: {','.join(required)}); "
            f"see reports/expected/README.md"
        )
    return df


@dataclass
class AcceptResult:
    written: dict[str, Path]  # file stem (mode, or phase-mode) -> file
    rows: dict[str, int]  # file stem -> rows written
    changed: dict[str, int]  # file stem -> rows whose accepted status changed (added, removed or different)


def accept(run: Run, expected_dir: str | Path = DEFAULT_DIR, update: bool = False) -> AcceptResult:
    """Rewrite the file of every (phase, mode) present in the run (mode_file).

    update=False: the run is the new truth for those (phase, mode) pairs (entries absent from it are dropped).
    update=True: only the run's rows are added or changed; other accepted entries are kept (for accepting a
    targeted re-run of a few entries).
    """
    d = Path(expected_dir)
    if run.df.empty:
        raise InputError(
            f"{run.path}/results.csv has no rows; accepting it would empty the expected results - "
            f"accept a finished sweep instead"
        )
    config = run_configuration(run)
    if any(mode_file(d, m, ph).exists() for ph, m in expected_files()):
        check_configuration(run, d)  # never mix configurations in one directory
    d.mkdir(parents=True, exist_ok=True)
    if config != DEFAULT_CONFIGURATION or (d / CONFIGURATION).exists():
        import json

        atomic_write_text(d / CONFIGURATION, json.dumps(config, indent=1) + "\n")
    res = AcceptResult(written={}, rows={}, changed={})
    phases = run.df["phase"].where(run.df["phase"] != "", "inference") if "phase" in run.df.columns else None
    for phase, mode in expected_files():
        sub = run.df[(run.df["mode"] == mode) & ((phases == phase) if phases is not None else phase == "inference")]
        if sub.empty:
            continue  # a (phase, mode) the run did not sweep keeps its accepted file untouched
        p = mode_file(d, mode, phase)
        old: dict[str, str] = {}
        if p.exists():
            old_df = _read_csv(p, EXPECTED_COLUMNS)
            old = dict(zip(old_df["name"], old_df["status"], strict=True))
        new = dict(old) if update else {}
        new.update(zip(sub["entry_id"], sub["status"], strict=True))
        names = sorted(set(old) | set(new))
        res.changed[p.stem] = sum(old.get(n) != new.get(n) for n in names)
        out = pd.DataFrame(sorted(new.items()), columns=EXPECTED_COLUMNS)
        atomic_write_text(p, out.to_csv(index=False, lineterminator="\n"))
        res.written[p.stem] = p
        res.rows[p.stem] = len(out)
    return res
