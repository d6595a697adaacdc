"""Provides the `decodetop` command: argument parsing and dispatch to the subcommands.

Each subcommand lives in `decodetop.commands.<name>` with `add_arguments(parser)` and `run(args) -> int`. Those
modules import nothing heavy at module level (no torch, no textual), so `decodetop budget` stays fast and the
headless commands run where textual is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from decodetop import __version__
from decodetop.errors import DecodetopError
from decodetop.inert import guard_streams, inert

SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("probe", "measure decode-step primitives and components on every GPU (headless)"),
    ("budget", "the per-token budget and roofline of a model on a deployment (no GPU needed)"),
    ("whatif", "another deployment's step and tok/s, predicted from the curves measured on this host"),
    ("check", "host and GPU health checks; exit 0 ok, 1 warning, 2 critical, 3 unknown"),
    ("trace", "attribute a serving engine's profiler trace to the budget's components"),
    ("exporter", "serve telemetry, checks and probe results as Prometheus metrics (headless)"),
)


LIVE_UI = "decodetop (the live UI)"


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"decodetop.commands.{name}")


class _OneLineErrorParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, as every other decodetop error (exit code 2)."""

    flag_homes: dict[str, list[str]] | None = None
    """Flag → the commands that take it (set on the top parser by `build_parser`): a flag given where it does not
    belong is said with where it does."""

    given: Sequence[str] = ()
    """The arguments being parsed (the top parser's): a flag of a subcommand given before any subcommand takes its
    value for the command name (`decodetop --rounds 3`), and the error says where the flag belongs instead."""

    def error(self, message: str) -> NoReturn:
        """Print ``decodetop: error: --flag: <problem> (see <prog> --help)`` and exit 2, without the usage block."""
        if "COMMAND: invalid choice" in message:
            foreign = [
                a for a in self.given if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions
            ]
            if foreign and self.flag_homes is not None:
                message = self._misplaced(foreign, None)
        self.exit(2, f"decodetop: error: {message.removeprefix('argument ')} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """`parse_known_args`, then one line for what is left over: a flag of another command says which."""
        self.given = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._misplaced(extras, getattr(parsed, "command", None)))
        return parsed

    def _misplaced(self, extras: Sequence[str], command: str | None) -> str:
        """'--json is a flag of decodetop budget, decodetop probe, decodetop trace, not of decodetop (the live
        UI)', or argparse's own words for anything else."""
        here = f"decodetop {command}" if command else LIVE_UI
        for extra in extras:
            flag = extra.split("=", 1)[0]
            homes = [h for h in (self.flag_homes or {}).get(flag, []) if h != here]
            if flag.startswith("--") and homes:
                return f"{flag} is a flag of {', '.join(homes)}, not of {here}"
        return f"unrecognized arguments: {' '.join(extras)}"


def build_parser() -> _OneLineErrorParser:
    """The full parser: the live UI's flags at the top level, one subparser per headless command."""
    # allow_abbrev=False: a flag is spelt out, so one flag never reads as the prefix of another (--allreduce and
    # --allreduce-us of `decodetop budget`).
    parser = _OneLineErrorParser(
        prog="decodetop",
        allow_abbrev=False,
        description="Where a multi-GPU LLM decode step's time goes, and whether the host is set up right. "
        "With no subcommand, starts the live terminal UI.",
    )
    parser.add_argument("--version", action="version", version=f"decodetop {__version__}")
    _command_module("tui").add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    homes: dict[str, list[str]] = {flag: [LIVE_UI] for flag in _flags_of(parser)}
    for name, help_text in SUBCOMMANDS:
        sub = subparsers.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        _command_module(name).add_arguments(sub)
        for flag in _flags_of(sub):
            homes.setdefault(flag, []).append(f"decodetop {name}")
    parser.flag_homes = homes
    return parser


def _flags_of(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags a parser takes itself (not --help and --version)."""
    return [f for f in parser._option_string_actions if f.startswith("--") and f not in ("--help", "--version")]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code.

    Standard output and error pass through `decodetop.inert.guard_streams` for the whole run: text from a file or a
    server (a kernel name, an error body) printed by any command reaches the terminal with its controls marked."""
    with guard_streams():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = args.command or "tui"
    try:
        return int(_command_module(name).run(args))
    except DecodetopError as exc:
        print(f"decodetop: error: {inert(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("decodetop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `decodetop check | head`: the reader went away; exit quietly, as coreutils do.
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
