"""One cache entry on disk: a magic line, the payload's SHA-256, the payload; written atomically.

The graph cache (compile_cache.store) and the executable cache share this file format and its failure rules:
a missing entry is a miss; an unreadable or corrupt one is a miss with a warning (the caller then compiles); a
directory that cannot be written costs speed, never correctness. Nothing here imports JAX or torch, so both
caches (which sit in different layers) can use it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

Warn = Callable[[str, str], None]  # (where, message): the caller's warn-once
_DIGEST = 32  # SHA-256


def read(path: Path, magic: bytes, warn: Warn, *, touch: bool = False) -> tuple[bytes | None, bool]:
    """(payload, corrupt): (None, False) when absent; (None, True) when unreadable or corrupt, after `warn`.
    `touch` refreshes the entry's mtime so that pruning by age keeps used entries."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        warn(str(path), f"cannot read {path} ({exc}); compiling instead")
        return None, True
    head = len(magic) + _DIGEST
    if len(data) < head or not data.startswith(magic) or hashlib.sha256(data[head:]).digest() != data[len(magic):head]:
        warn(str(path), f"ignoring corrupt cache entry {path} (checksum mismatch); compiling instead")
        return None, True
    if touch:
        try:
            os.utime(path)
        except OSError:
            pass
    return data[head:], False


def write(path: Path, magic: bytes, payload: bytes, warn: Warn) -> bool:
    """Frames `payload` and writes it atomically; False (after `warn`) when the directory cannot be written."""
    return write_raw(path, magic + hashlib.sha256(payload).digest() + payload, warn)


def link(source: Path, path: Path) -> bool:
    """Makes `path` name the entry at `source` (a hard link, made under a temporary name and renamed, as
    write_raw does); False when it cannot be made (no such entry, a file system without hard links, a
    directory that cannot be written): the caller then writes a copy."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-link-{os.urandom(8).hex()}"  # a fresh name: os.link does not overwrite
        os.link(source, tmp)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return True
    except OSError:  # the caller's copy (write) warns when the directory cannot be written
        return False


def write_raw(path: Path, data: bytes, warn: Warn) -> bool:
    """Writes `data` to `path` through a temporary file and a rename: a concurrent reader (another process
    of a sweep) sees the old file or the new one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return True
    except OSError as exc:  # a read-only or full cache directory costs speed, not correctness
        warn(str(path.parent), f"cannot write to {path.parent} ({exc}); not caching there")
        return False
