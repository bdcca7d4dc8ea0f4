"""hf-tpu's metadata is pyproject.toml's; this file only ships hf_tpu_guard.pth, a start-up file Python's
`site` runs when the interpreter starts (why: _hf_tpu_guard.py). A .pth file must sit at the top of
site-packages, which pyproject.toml cannot express, so two setuptools commands are extended:

- build_py copies it to the top of the build tree: a regular wheel (`pip install .`) carries it;
- editable_wheel adds it to the editable wheel (`pip install -e .`), whose finder strategy leaves out
  whatever build_py writes outside the packages.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "hf_tpu_guard.pth"
HERE = Path(__file__).resolve().parent


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(HERE / PTH), str(Path(self.build_lib, PTH)), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [] if self.editable_mode else [str(Path(self.build_lib, PTH))]
        return [*super().get_outputs(include_bytecode), *extra]


cmdclass = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: `pip install -e .` runs `develop`, which writes its own .pth
    editable_wheel = None

if editable_wheel is not None:
    class _StrategyWithPth:
        """Wraps setuptools' editable strategy: the .pth goes into the wheel with the strategy's files, before
        the wheel's RECORD is written."""

        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __enter__(self) -> _StrategyWithPth:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> object:
            return self.inner.__exit__(*exc)

        def __call__(self, wheel: object, files: list[str], mapping: dict[str, str]) -> None:
            self.inner(wheel, files, mapping)
            wheel.write(str(HERE / PTH), PTH)

    class EditableWheelWithPth(editable_wheel):
        def _select_strategy(self, *args: object, **kwargs: object) -> _StrategyWithPth:
            return _StrategyWithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
