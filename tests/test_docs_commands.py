"""Every command the docs quote still works as written: README.md, AGENTS.md, benchmarks/README.md and docs/.

- `decodetop …` (also `python3 -m decodetop`, `.venv/bin/decodetop`): parsed by the real parser, so every flag and
  value type holds; each subcommand's `--help` runs; the ones that need no GPU, no server and no file of the
  reader's (`budget`, `check`) run for real here, on CPU. A quote that only names a flag (`decodetop budget
  --diff`) or a file of the reader's (`--root host.tar.gz`) is allowed to stop at that, and docs/hostile-input.md,
  which quotes bad input on purpose, must get its one-line error.
- `python3 benchmarks/….py …`: the script exists and its `--help` lists every flag quoted.
- `bash scripts/…`, `bash benchmarks/….sh`: the file exists.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from decodetop.cli import SUBCOMMANDS, build_parser
from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = (
    ROOT / "README.md",
    ROOT / "AGENTS.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
)
BAD_INPUT_DOC = "docs/hostile-input.md"
"""Quotes bad input on purpose: each decodetop command there must be refused with one line."""

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
DECODETOP = re.compile(r"^(?:\.venv/bin/decodetop|decodetop|python3? -m decodetop)(?=\s|$)")
SCRIPT = re.compile(r"^(python3?|bash|sh) ((?:benchmarks|scripts)/[\w./-]+)")
COMMENT = re.compile(r"\s+#(?:\s|$).*$")
DIAGRAM = re.compile(r"[\u2500-\u257f\u2190-\u21ff]")
"""Box-drawing characters and arrows: a line of a drawing that happens to start with a command's name."""
PLACEHOLDERS = {"…", "...", "…]", "[…"}
FILE_ARG = re.compile(r"(/|\.(json|jsonl|gz|tar|log|toml)$)")
RUN_HERE = {"budget", "check"}
"""Subcommands that run here for real (no GPU, no server needed) when the quote names no file of the reader's."""


@dataclass(frozen=True)
class Quote:
    doc: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.text}"


def _code_lines(text: str) -> list[str]:
    """The lines of fenced and indented code blocks (a line ending in a backslash joined to the next), and every
    inline code span."""
    lines = [line for block in FENCE.findall(text) for line in block.splitlines()]
    prose = FENCE.sub("", text)
    lines += [line for line in prose.splitlines() if line.startswith("    ") and line.strip()]
    joined: list[str] = []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line)
    return joined + SPAN.findall(prose)


def _quotes(pattern: re.Pattern[str]) -> list[Quote]:
    found: dict[Quote, None] = {}
    for doc in DOCS:
        for line in _code_lines(doc.read_text(encoding="utf-8")):
            command = ENV_PREFIX.sub("", line.strip().removeprefix("$ "))
            command = COMMENT.sub("", command).strip()
            if pattern.match(command) and not DIAGRAM.search(command):
                found[Quote(doc.relative_to(ROOT).as_posix(), command)] = None
    return list(found)


def _decodetop_args(quote: Quote) -> list[str]:
    match = DECODETOP.match(quote.text)
    assert match is not None
    return [t for t in shlex.split(quote.text[match.end() :]) if t not in PLACEHOLDERS]


DECODETOP_QUOTES = [q for q in _quotes(DECODETOP) if not (_decodetop_args(q) or [""])[0].endswith(":")]
"""Quoted decodetop commands (a line such as `decodetop check: UNKNOWN: …` is output, not a command)."""
SCRIPT_QUOTES = _quotes(SCRIPT)


def _parse(args: list[str]) -> str:
    """ "" when the real parser takes `args`, else its one-line error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exc:
        return "" if exc.code == 0 else err.getvalue().strip() or f"exit {exc.code}"  # 0: --help, --version
    return ""


def _names_only_a_flag_or_a_readers_file(args: list[str], error: str) -> bool:
    mention = bool(args) and args[-1].startswith("--") and re.search(r"expected (one|\d+) arguments?", error)
    return bool(mention) or "no such file or directory" in error


def test_the_docs_quote_commands_at_all() -> None:
    subs = {next((a for a in _decodetop_args(q) if not a.startswith("-")), "") for q in DECODETOP_QUOTES}
    assert {name for name, _ in SUBCOMMANDS} <= subs  # every subcommand is quoted somewhere
    assert len(DECODETOP_QUOTES) >= 30 and len(SCRIPT_QUOTES) >= 15


@pytest.mark.parametrize("quote", DECODETOP_QUOTES, ids=str)
def test_quoted_decodetop_command_parses(quote: Quote) -> None:
    args = _decodetop_args(quote)
    error = _parse(args)
    if quote.doc == BAD_INPUT_DOC:
        assert error.startswith("decodetop: error: ") and "\n" not in error, error
    else:
        assert not error or _names_only_a_flag_or_a_readers_file(args, error), error


@pytest.mark.parametrize("subcommand", ["", *(name for name, _ in SUBCOMMANDS)])
def test_every_subcommand_answers_help(subcommand: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "decodetop", *([subcommand] if subcommand else []), "--help"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: decodetop{' ' + subcommand if subcommand else ''}")


RUNNABLE = [
    q
    for q in DECODETOP_QUOTES
    if q.doc != BAD_INPUT_DOC
    and (args := _decodetop_args(q))
    and args[0] in RUN_HERE
    and not _parse(args)
    and not any(FILE_ARG.search(a) for a in args[1:])
]


@pytest.mark.parametrize("quote", RUNNABLE, ids=str)
def test_quoted_command_runs_here(quote: Quote) -> None:
    """`budget` and `check` need no GPU: as quoted, they run on this machine (check's exit code is its verdict)."""
    args = _decodetop_args(quote)
    done = subprocess.run(
        [sys.executable, "-m", "decodetop", *args],
        cwd=ROOT,
        env=subprocess_env(COLUMNS="120"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    allowed = {0, 1, 2, 3} if args[0] == "check" else {0}
    assert done.returncode in allowed and done.stdout.strip(), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_some_quotes_run_for_real() -> None:
    assert {_decodetop_args(q)[0] for q in RUNNABLE} == RUN_HERE


@pytest.mark.parametrize("quote", SCRIPT_QUOTES, ids=str)
def test_quoted_script_exists_and_takes_the_quoted_flags(quote: Quote) -> None:
    match = SCRIPT.match(quote.text)
    assert match is not None
    path = ROOT / match.group(2)
    assert path.is_file(), f"{quote.doc} quotes {match.group(2)}, which does not exist"
    flags = sorted({t.split("=")[0] for t in shlex.split(quote.text[match.end() :]) if t.startswith("--")})
    if path.suffix != ".py" or not flags:
        return
    done = subprocess.run(
        [sys.executable, str(path), "--help"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    unknown = [f for f in flags if f not in done.stdout]
    assert not unknown, f"{quote.doc}: {path.name} --help lists none of {', '.join(unknown)}"
