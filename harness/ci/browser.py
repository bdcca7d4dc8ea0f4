"""Headless Chromium (Debian's `chromium` package) for checking and screenshotting the dashboard offline.

Each call starts a fresh browser with a throwaway profile and every background network feature off, so the
page is judged on what it carries itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in containers/CI has no user namespace sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
)


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    """Path of a Chromium binary: $CHROMIUM, else the first of CANDIDATES on PATH, else /usr/bin/chromium."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    for c in CANDIDATES:
        p = shutil.which(c)
        if p:
            return p
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def file_url(path: str | Path, fragment: str = "") -> str:
    url = Path(path).resolve().as_uri()
    return f"{url}#{fragment}" if fragment else url


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise BrowserError("no Chromium found (install Debian's `chromium` package, or set $CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="hf-tpu-chromium-") as profile:
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BrowserError(f"chromium did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise BrowserError(f"chromium exited {proc.returncode}: {tail}")
    return proc


def dump_dom(url: str, width: int = 1280, height: int = 2000, timeout: float = 90.0) -> str:
    """The DOM after the page's scripts ran (chromium --dump-dom), laid out in a width x height window."""
    return _run([f"--window-size={width},{height}", "--dump-dom", url], timeout).stdout


def screenshot(url: str, out: str | Path, width: int = 1280, height: int = 2000, timeout: float = 90.0) -> Path:
    """A PNG of the page's first width x height pixels."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    _run([f"--screenshot={out}", f"--window-size={width},{height}", "--virtual-time-budget=3000", url], timeout)
    if not out.is_file():
        raise BrowserError(f"chromium did not write {out}")
    return out
