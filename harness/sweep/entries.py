"""Which entries a sweep runs: load the zoo (or the test zoo), select, shard."""

from __future__ import annotations

import os
import re

from harness.sweep import testzoo
from harness.sweep.options import SweepOptions

BUILTIN_ZOOS = ("smoke", "full")


class SelectionError(ValueError):
    """Bad input naming the problem: the CLI exits with status 2."""


def is_test_zoo(spec: str) -> bool:
    return spec == "test" or spec.startswith("test:")


def load_entries(opts: SweepOptions) -> list:
    spec = opts.zoo
    if is_test_zoo(spec):
        try:
            entries = testzoo.parse_spec(spec)
        except ValueError as exc:
            raise SelectionError(str(exc)) from None
    else:
        if spec not in BUILTIN_ZOOS and not os.path.isfile(spec):
            raise SelectionError(
                f"unknown zoo {spec!r}: expected smoke, full, test[:NAMES] or the path of a models-list CSV"
            )
        try:
            from harness.zoo import load_zoo
        except ImportError as exc:
            raise SelectionError(f"the model zoo is not available in this build ({exc})") from None
        try:
            entries = list(load_zoo(spec, hub_layers=opts.hub_layers))
        except Exception as exc:  # noqa: BLE001  (a malformed models list, whatever the zoo raises)
            what = "models list" if os.path.isfile(spec) else "zoo"
            raise SelectionError(f"cannot read {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    selected = select(entries, opts)
    if not selected:
        what = ", ".join(f"{k} {v!r}" for k, v in (("library", opts.library), ("task", opts.task),
                                                     ("match", opts.match)) if v)
        raise SelectionError(f"no entry of zoo {spec!r} matches {what or 'the selection'}")
    return shard(selected, opts.shard, opts.limit)


def compile_match(pattern: str | None):
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError(f"bad --match regex {pattern!r}: {exc}") from None


def select(entries: list, opts: SweepOptions) -> list:
    rx = compile_match(opts.match)
    if not is_test_zoo(opts.zoo):
        try:
            from harness.zoo import select as zoo_select

            return list(zoo_select(entries, library=opts.library, task=opts.task, match=opts.match))
        except ImportError:
            pass
    out = []
    for e in entries:
        if opts.library and e.library != opts.library:
            continue
        if opts.task and e.task != opts.task:
            continue
        if rx is not None and not rx.search(e.id):
            continue
        out.append(e)
    return out


def shard(entries: list, which: tuple[int, int], limit: int | None = None) -> list:
    """Shard i of N (1-based): every N-th entry of the id-sorted selection, from the i-th. Deterministic,
    balanced to one entry, and the N shards partition the selection."""
    i, n = which
    ordered = sorted(entries, key=lambda e: e.id)
    if limit is not None:
        ordered = ordered[:limit]
    return ordered[i - 1 :: n]


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m:
        raise SelectionError(f"bad --shard {text!r}: expected i/N with 1 <= i <= N, e.g. 1/4")
    i, n = int(m.group(1)), int(m.group(2))
    if not (1 <= i <= n):
        raise SelectionError(f"bad --shard {text!r}: expected i/N with 1 <= i <= N, e.g. 1/4")
    return i, n
