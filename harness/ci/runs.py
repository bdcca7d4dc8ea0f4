"""Reading a run directory (`reports/<run-id>/results.csv`) into a validated DataFrame.

Everything in harness.ci reads runs through `load_run`, so bad input is caught in one place and reported
as an `InputError` naming the problem and the fix; the CLIs turn that into exit status 2.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import schema

RESULTS = "results.csv"

_FLOAT_COLUMNS = [c for c, t, _ in schema.COLUMNS if t == "float"]
_INT_COLUMNS = [c for c, t, _ in schema.COLUMNS if t == "int"]


class InputError(Exception):
    """Bad input from the user (missing or malformed file): the message says what and how to fix it."""


@dataclass
class Run:
    """One sweep's results: where they came from and the validated rows."""

    path: Path
    df: pd.DataFrame

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def timestamp(self) -> str:
        # The latest row time is when the run finished; ISO-8601 strings sort chronologically.
        ts = self.df["timestamp"] if len(self.df) else pd.Series([], dtype=str)
        ts = ts[ts != ""]
        return str(ts.max()) if len(ts) else ""


def results_path(run: str | Path) -> Path:
    """Accept either a run directory or a results.csv path."""
    p = Path(run)
    return p if p.suffix == ".csv" else p / RESULTS


def load_run(run: str | Path) -> Run:
    """Load and validate `RUN/results.csv`; raise InputError on anything the rest of harness.ci can't trust."""
    csv_path = results_path(run)
    run_dir = csv_path.parent
    if not run_dir.exists():
        raise InputError(
            f"run directory {run_dir} does not exist; pass the directory a sweep wrote "
            f"(`hf-tpu sweep --out DIR`, by default reports/<run-id>/)"
        )
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a directory; pass the run directory that holds {RESULTS}")
    if not csv_path.is_file():
        raise InputError(
            f"{csv_path} not found: {run_dir} is not a finished sweep output; run `hf-tpu sweep --out {run_dir}` "
            f"(or `hf-tpu merge` for sharded runs) to create it"
        )
    df = read_results_csv(csv_path)
    return Run(path=run_dir, df=df)


def read_results_csv(csv_path: Path) -> pd.DataFrame:
    """Parse and validate one results.csv against harness.schema."""
    try:
        # Everything as text first so empty cells stay "" (not NaN) and nothing is guessed.
        df = pd.read_csv(csv_path, dtype=str, keep_default_na=False, na_values=[])
    except pd.errors.EmptyDataError:
        raise InputError(
            f"{csv_path} is empty (not even a header); the sweep that wrote it did not finish - re-run it"
        ) from None
    except (pd.errors.ParserError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            f"{csv_path} is not a valid CSV ({str(exc).strip().splitlines()[0]}); re-run the sweep or "
            f"`hf-tpu merge` that wrote it"
        ) from None

    if "schema_version" in df.columns and len(df):
        versions = sorted(set(df["schema_version"]))
        known = {str(v) for v in schema.CHANGES}
        if not set(versions) <= known:
            raise InputError(
                f"{csv_path} has schema_version {', '.join(versions)} but this hf-tpu reads versions "
                f"1..{schema.SCHEMA_VERSION} ({schema.CHANGES.get(schema.SCHEMA_VERSION, '')}); re-run the sweep "
                f"with this hf-tpu, or read it with the hf-tpu version that wrote it"
            )
        for c in schema.absent_in(min(int(v) for v in versions)):  # an older file: columns added since are empty
            if c not in df.columns:
                df[c] = ""
    missing = [c for c in schema.COLUMN_NAMES if c not in df.columns]
    if missing:
        raise InputError(
            f"{csv_path} lacks the schema column(s) {', '.join(missing)}; it was not written by "
            f"`hf-tpu sweep` of schema version {schema.SCHEMA_VERSION} - re-run the sweep"
        )

    bad_status = sorted(set(df["status"]) - set(schema.STATUSES))
    if bad_status:
        raise InputError(
            f"{csv_path} has unknown status value(s) {', '.join(map(repr, bad_status))}; valid statuses are "
            f"{', '.join(schema.STATUSES)} (harness/schema.py)"
        )
    bad_mode = sorted(set(df["mode"]) - set(schema.MODES))
    if bad_mode:
        raise InputError(
            f"{csv_path} has unknown mode value(s) {', '.join(map(repr, bad_mode))}; valid modes are "
            f"{', '.join(schema.MODES)}"
        )
    if (df["entry_id"] == "").any():
        raise InputError(f"{csv_path} has rows with an empty entry_id; re-run the sweep that wrote it")
    dup = df[df.duplicated(list(schema.KEY), keep=False)]
    if len(dup):
        first = dup.iloc[0]
        raise InputError(
            f"{csv_path} has {len(dup)} rows sharing an (entry_id, mode) key, e.g. "
            f"({first['entry_id']}, {first['mode']}); each entry must appear once per mode - "
            f"re-run `hf-tpu merge` on shards that do not overlap"
        )

    # Typed columns; an empty or unparsable cell becomes NaN (floats) or <NA> (ints).
    for c in _FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    for c in _INT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return df
