"""`hf-tpu` command line: one subcommand per harness module, imported lazily so `--help` is fast."""

from __future__ import annotations

import argparse
import importlib
import sys

# (subcommand, module, help). Each module exposes `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: list[tuple[str, str, str]] = [
    ("zoo", "harness.zoo.cli", "list and check the built-in model zoo"),
    ("sweep", "harness.sweep.cli", "run the zoo on `tpu`, eager and compiled, against a CPU baseline"),
    ("merge", "harness.sweep.merge_cli", "join the outputs of sharded sweeps"),
    ("compare", "harness.ci.compare_cli", "compare a run with the expected results"),
    ("accept", "harness.ci.accept_cli", "rewrite the expected results from a run"),
    ("report", "harness.ci.report_cli", "write the static HTML dashboard for one or more runs"),
    ("upstream-tests", "harness.upstream.cli", "run a Transformers checkout's own model tests on cpu and tpu"),
    ("diagnose", "harness.diagnose.cli", "locate the first module and op that go wrong for one entry"),
    ("demo", "harness.demo", "a tiny model on `tpu`, eager and compiled"),
]


class _Parser(argparse.ArgumentParser):
    # argparse already exits with status 2 on bad input; keep the message on one clear line.
    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = _Parser(prog="hf-tpu", description="PyTorch `tpu` device coverage for Hugging Face models")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules: dict[str, object] = {}
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, modname, help_ in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        # Only the chosen subcommand's module is imported: others may pull in heavy libraries.
        if name == wanted:
            try:
                mod = importlib.import_module(modname)
            except ModuleNotFoundError as exc:  # a subcommand whose module is not built yet
                if exc.name and modname.startswith(exc.name):
                    parser.exit(2, f"hf-tpu: `{name}` is not available in this build ({exc})\n")
                raise
            mod.add_arguments(p)
            modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["sweep", *argv]  # the main job: `hf-tpu [sweep options]` runs the sweep
    parser, modules = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
