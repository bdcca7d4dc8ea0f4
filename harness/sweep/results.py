"""Durable results: one file per finished entry (written atomically: temp file, fsync, rename, fsync of the
directory) under `<out>/rows/`, consolidated into `results.csv` (harness/schema.py) at the end. A `kill -9`
loses only the entries in flight; `--resume` reads `rows/` and runs only entries without a file there."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path

from harness.schema import (
    CAUSES,
    CHANGES,
    COLUMN_NAMES,
    COLUMNS,
    KEY,
    MODES,
    PHASES,
    SCHEMA_VERSION,
    STATUSES,
    absent_in,
)

RUN_FILE = "run.json"
ROWS_DIR = "rows"
RESULTS_CSV = "results.csv"
_TYPES = {name: typ for name, typ, _ in COLUMNS}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def check_writable(out: Path) -> None:
    """Refuse an output directory that cannot be written, before any work. Raises OSError."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ROWS_DIR).mkdir(exist_ok=True)
    atomic_write(out / ROWS_DIR / ".probe", b"ok")
    (out / ROWS_DIR / ".probe").unlink()


def entry_filename(entry_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", entry_id)[:80]
    return f"{safe}-{hashlib.sha1(entry_id.encode()).hexdigest()[:10]}.json"


def _clean(value):
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class ResultStore:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.rows_dir = self.out / ROWS_DIR

    # run metadata ------------------------------------------------------------------------------------------
    def read_run(self) -> dict | None:
        p = self.out / RUN_FILE
        return json.loads(p.read_text()) if p.exists() else None

    def write_run(self, meta: dict) -> None:
        atomic_write(self.out / RUN_FILE, json.dumps(meta, indent=2, sort_keys=True).encode())

    # rows --------------------------------------------------------------------------------------------------
    def write_entry(self, entry_id: str, rows: list[dict]) -> None:
        stamp = utc_now()
        full = [{**{c: None for c in COLUMN_NAMES}, **{k: _clean(v) for k, v in r.items() if k in _TYPES},
                 "timestamp": stamp, "schema_version": SCHEMA_VERSION} for r in rows]
        payload = {"entry_id": entry_id, "rows": full}
        atomic_write(self.rows_dir / entry_filename(entry_id), json.dumps(payload).encode())

    def completed(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        if not self.rows_dir.is_dir():
            return out
        for p in sorted(self.rows_dir.glob("*.json")):
            try:
                payload = json.loads(p.read_text())
            except (OSError, ValueError):
                continue  # cannot happen with atomic writes; a stray file is ignored
            out[payload["entry_id"]] = payload["rows"]
        return out

    def all_rows(self) -> list[dict]:
        return [r for rows in self.completed().values() for r in rows]


# ------------------------------------------------------------------------------------------------- the CSV
def to_frame(rows: list[dict]):
    import pandas as pd

    df = pd.DataFrame(rows, columns=COLUMN_NAMES)
    df["phase"] = df["phase"].where(df["phase"].notna() & df["phase"].ne(""), "inference")  # rows before v4
    for name, typ, _ in COLUMNS:
        if typ == "float":
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
        elif typ == "int":
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("Int64")
        else:
            df[name] = df[name].astype("object").where(df[name].notna(), "").astype(str)
    if len(df):
        df = df.sort_values(list(KEY), kind="stable").reset_index(drop=True)
    return df


def write_csv(df, path: Path) -> None:
    atomic_write(Path(path), df.to_csv(index=False).encode())


def read_csv(path: str | Path):
    import pandas as pd

    dtypes = {n: ("float64" if t == "float" else "Int64" if t == "int" else str) for n, t, _ in COLUMNS}
    df = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values={n: [""] for n, t, _ in COLUMNS if t != "str"})
    return upgrade(df)


def upgrade(df):
    """A frame of an older schema version with the columns added since (empty), in schema order."""
    if "schema_version" not in df.columns or not len(df):
        return df
    oldest = int(df["schema_version"].min())
    import pandas as pd

    kinds = {n: t for n, t, _ in COLUMNS}
    for c in absent_in(oldest):
        if c not in df.columns:  # empty, in the column's own type (a float column is NaN, not "")
            k = kinds.get(c, "str")
            if k == "str":
                df[c] = ""
            else:
                df[c] = pd.Series(math.nan if k == "float" else pd.NA, index=df.index,
                                  dtype="float64" if k == "float" else "Int64")
    if "phase" in df.columns:  # a file before version 4 holds inference rows only
        df["phase"] = df["phase"].where(df["phase"].ne(""), "inference")
    return df[[c for c in COLUMN_NAMES if c in df.columns] + [c for c in df.columns if c not in COLUMN_NAMES]]


def validate(df) -> list[str]:
    """Problems with a results frame against harness/schema.py (empty list: valid)."""
    problems = []
    if list(df.columns) != COLUMN_NAMES:
        problems.append(f"columns {list(df.columns)} != schema {COLUMN_NAMES}")
        return problems
    bad = sorted(set(df["status"]) - set(STATUSES))
    if bad:
        problems.append(f"unknown statuses {bad}")
    bad = sorted(set(df["phase"]) - set(PHASES))
    if bad:
        problems.append(f"unknown phases {bad}")
    bad = sorted(set(df["mode"]) - set(MODES))
    if bad:
        problems.append(f"unknown modes {bad}")
    dup = df.duplicated(list(KEY), keep=False)
    if dup.any():
        problems.append(f"duplicate keys: {df.loc[dup, list(KEY)].values.tolist()[:5]}")
    unknown = sorted(set(df["schema_version"].astype("Int64").dropna()) - set(CHANGES))
    if unknown:
        problems.append(f"rows with unknown schema_version {unknown} (this hf-tpu reads 1..{SCHEMA_VERSION})")
    bad = sorted(set(df["cause"]) - set(CAUSES) - {""})
    if bad:
        problems.append(f"unknown causes {bad}")
    for name, typ, _ in COLUMNS:
        if typ in ("float", "int") and str(df[name].dtype) not in ("float64", "Int64", "int64"):
            problems.append(f"column {name} is {df[name].dtype}, expected {typ}")
    empty = df["entry_id"].eq("") | df["status"].eq("")
    if empty.any():
        problems.append(f"{int(empty.sum())} rows without entry_id or status")
    return problems


def load_run_rows(run_dir: str | Path):
    """A run directory's rows as a frame: results.csv, or the `rows/` journal of an unfinished run."""
    run_dir = Path(run_dir)
    if (run_dir / RESULTS_CSV).exists():
        return read_csv(run_dir / RESULTS_CSV)
    store = ResultStore(run_dir)
    if store.rows_dir.is_dir():
        return to_frame(store.all_rows())
    raise FileNotFoundError(f"{run_dir} has neither {RESULTS_CSV} nor a {ROWS_DIR}/ directory")
