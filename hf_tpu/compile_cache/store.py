"""Where saved graphs live: three tiers, looked up in order.

- memory: this process (a dict; the loaded, ready-to-run functions);
- host: a directory shared by the processes of this machine (hf_tpu.runtime.graph_cache_dir():
  $HF_TPU_GRAPH_CACHE_DIR, else `$HF_TPU_CACHE_DIR/graphs`, else ~/.cache/hf_tpu/graphs);
- shared: optional, $HF_TPU_SHARED_CACHE_DIR, a directory many machines mount (or a CI cache restores).
  A hit there is copied to the host tier; new entries are written to both.

One file per key, `<dir>/<key[:2]>/<key>.graph`: a magic line, the SHA-256 of the payload, the payload.
A file that is truncated, corrupt or unreadable is ignored with a warning (a miss, then overwritten by the
next compile): a cache can cost time, never a crash or a wrong result. Writes are atomic (a temporary file
renamed), so concurrent processes never read half a file. "Negative" entries (`<key>.skip`) record that a
call cannot be saved (a graph break), so a warm process goes straight to the normal compile.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

from hf_tpu import cache_entries

MAGIC = b"hf_tpu-graph-cache-v1\n"
TIERS = ("memory", "host", "shared")

_lock = threading.Lock()
_counts: dict[str, dict[str, int]] = {t: {"hits": 0, "misses": 0} for t in TIERS}
_extra: dict[str, int] = {"saved": 0, "unsaveable": 0, "corrupt": 0, "stale": 0, "guard_misses": 0}
_warned: set[str] = set()


def bump(tier: str, what: str) -> None:
    with _lock:
        if tier in _counts:
            _counts[tier][what] += 1
        else:
            _extra[what] = _extra.get(what, 0) + 1


def stats() -> dict[str, object]:
    with _lock:
        out: dict[str, object] = {t: dict(c) for t, c in _counts.items()}
        out.update(_extra)
    return out


def reset_stats() -> None:
    with _lock:
        for c in _counts.values():
            c["hits"] = c["misses"] = 0
        for k in _extra:
            _extra[k] = 0


def warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"hf_tpu compile cache: {message}", RuntimeWarning, stacklevel=3)


def host_dir() -> Path:
    from hf_tpu import runtime

    return runtime.graph_cache_dir()


def shared_dir() -> Path | None:
    from hf_tpu import runtime

    return runtime.shared_cache_dir()


def disk_tiers() -> list[tuple[str, Path]]:
    out = [("host", host_dir())]
    shared = shared_dir()
    if shared is not None:
        out.append(("shared", shared))
    return out


def _path(root: Path, key: str, suffix: str = ".graph") -> Path:
    return root / key[:2] / f"{key}{suffix}"


def read(root: Path, key: str) -> bytes | None:
    """The payload saved under `key`, or None (absent, or unreadable/corrupt: then with a warning)."""
    # touch: a used entry stays when cache pruning (the nightly's) drops entries by age
    payload, corrupt = cache_entries.read(_path(root, key), MAGIC, warn_once, touch=True)
    if corrupt:
        bump("", "corrupt")
    return payload


def write(root: Path, key: str, payload: bytes) -> bool:
    return cache_entries.write(_path(root, key), MAGIC, payload, warn_once)


def is_unsaveable(root: Path, key: str) -> bool:
    return _path(root, key, ".skip").exists()


def mark_unsaveable(root: Path, key: str, reason: str) -> None:
    cache_entries.write_raw(_path(root, key, ".skip"), reason.encode(errors="replace")[:4000], warn_once)


