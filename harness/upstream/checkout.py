"""A Transformers source checkout: its version (which must be the installed one), its model families and test
files, and the root pytest runs from."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

SHIM = Path(__file__).parent / "shim"
_VERSION_RES = [
    ("src/transformers/__init__.py", re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)),
    ("setup.py", re.compile(r"""version\s*=\s*["']([^"']+)["']""")),
    ("PKG-INFO", re.compile(r"^Version:\s*(\S+)", re.M)),
]


class CheckoutError(ValueError):
    """The checkout cannot be used; the message says why and what to do."""


def installed_version() -> str:
    return importlib.metadata.version("transformers")


def checkout_version(src: Path) -> str | None:
    """The Transformers version a checkout holds, from its sources (None if it has none of the files)."""
    for rel, pattern in _VERSION_RES:
        f = src / rel
        if f.is_file():
            m = pattern.search(f.read_text(encoding="utf-8", errors="replace"))
            if m:
                return m.group(1)
    return None


def check(src: Path, assumed_version: str | None = None) -> str:
    """The checkout's version, after checking it is a checkout with tests and holds the installed version."""
    installed = installed_version()
    if not (src / "tests").is_dir():
        raise CheckoutError(
            f"{src} has no tests/ folder: pass the root of a Transformers source checkout, e.g. "
            f"`git clone --depth 1 --branch v{installed} https://github.com/huggingface/transformers`."
        )
    found = checkout_version(src)
    if found and assumed_version and found != assumed_version:
        raise CheckoutError(f"--transformers-version {assumed_version} contradicts the checkout, which holds "
                            f"Transformers {found} ({src}).")
    version = found or assumed_version
    if version is None:
        raise CheckoutError(
            f"cannot tell which Transformers version {src} holds (it has no src/transformers/__init__.py, "
            "setup.py or PKG-INFO): pass --transformers-version X.Y.Z, the version its tests come from."
        )
    if version != installed:
        raise CheckoutError(
            f"{src} holds Transformers {version}, but Transformers {installed} is installed: its tests would test "
            f"other code than they were written for. Check out the matching tag (`git -C {src} checkout "
            f"v{installed}`) or install the checkout's version (`pip install transformers=={version}`)."
        )
    return version


def available_families(src: Path) -> list[str]:
    models = src / "tests" / "models"
    if not models.is_dir():
        return []
    return sorted(d.name for d in models.iterdir() if d.is_dir() and any(d.glob("test_modeling_*.py")))


def select_families(src: Path, wanted: str) -> list[str]:
    """`wanted`: "all" or a comma-separated list of tests/models/<family> folder names."""
    have = available_families(src)
    if not have:
        raise CheckoutError(f"{src}/tests/models has no model test folders (tests/models/<family>/test_modeling_*.py)")
    if wanted.strip().lower() == "all":
        return have
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [n for n in names if n not in have]
    if unknown:
        shown = ", ".join(have[:30]) + (f", … ({len(have)} in all)" if len(have) > 30 else "")
        raise CheckoutError(f"no model tests for {', '.join(unknown)} in {src}/tests/models; families there: {shown}")
    return names


def test_files(src: Path, families: list[str]) -> list[str]:
    """PyTorch modeling test files of the families, relative to the checkout root (TF/Flax ones left out)."""
    out = []
    for fam in families:
        for f in sorted((src / "tests" / "models" / fam).glob("test_modeling_*.py")):
            if not f.name.startswith(("test_modeling_tf_", "test_modeling_flax_")):
                out.append(f.relative_to(src).as_posix())
    return out


def staged_root(src: Path, work: Path) -> tuple[Path, list[str]]:
    """The root to run pytest from, and extra sys.path entries. A full checkout runs as it is. A bare copy of
    `tests/` (as in an sdist) lacks what the common mixins read beside it: `src/transformers/__init__.py`
    (test_pipeline_mixin.py reads it) and `utils/test_module` (test_configuration_utils.py imports it); then
    a staged root links the checkout's entries and the installed transformers package (its version was
    checked to be the checkout's), and the path gets a stand-in `test_module`."""
    extra = [] if (src / "utils" / "test_module").is_dir() else [str(SHIM)]
    if (src / "src" / "transformers" / "__init__.py").is_file():
        return src, extra
    stage = work / "stage"
    stage.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        link = stage / entry.name
        if not link.exists() and entry.name != "src":
            link.symlink_to(entry.resolve())
    spec = importlib.util.find_spec("transformers")
    pkg = Path(spec.origin).parent if spec and spec.origin else None
    if pkg is None:
        raise CheckoutError("transformers is not installed: `pip install transformers`")
    (stage / "src").mkdir(exist_ok=True)
    link = stage / "src" / "transformers"
    if not link.exists():
        os.symlink(pkg, link)
    return stage, extra
