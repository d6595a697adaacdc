"""Provides argparse `type=` functions for decodetop's flags, each refusing bad values with one clear line.

argparse turns the `argparse.ArgumentTypeError` raised here into ``decodetop: error: argument --timeout: …`` and
exit code 2, before any probe starts, any rank spawns or any file is opened: ``--timeout nan``, ``--model ''``, a
``--config`` that is a FIFO or ``/dev/zero``, or a ``--json`` path that is a directory fail at once.

Stdlib only.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
from pathlib import Path

from decodetop.errors import UserInputError
from decodetop.jsonio import file_kind

STDOUT = "-"
"""The output path that means standard output."""


def positive_finite_float(text: str) -> float:
    """A number > 0 that is neither NaN nor infinite (timeouts, step times, throughputs)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (ranks, TP degree, counts)."""
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def non_empty(text: str) -> str:
    """Any text with something in it besides blanks (a model name, a server URL)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def server_url(text: str) -> str:
    """A serving engine's URL (`http://host:port`, `host:port` or a full URL with a path), checked as every request
    will check it (`decodetop.httpget.check_url`): an unclosed IPv6 bracket, a port past 65535, an empty host label
    or a line break is refused here, in one line. Returned with ``http://`` added where no scheme was given."""
    from decodetop.httpget import BadUrlError, check_url, server_text  # http.client and ssl only where a URL is

    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    url = text.strip()
    if "://" not in url:
        url = "http://" + url
    try:
        check_url(url)
    except BadUrlError as exc:
        raise argparse.ArgumentTypeError(f"{server_text(text)!r}: {exc}") from None
    return url


def regular_file(text: str) -> Path:
    """An existing regular file (a config, a plan, a results file), checked with `stat`, never opened here: a
    FIFO, a device such as ``/dev/zero`` or a directory is refused before anything reads from it."""
    path, mode = _stat(text, missing="no such file")
    if not stat.S_ISREG(mode):
        raise argparse.ArgumentTypeError(f"{text}: {file_kind(mode)}, not a regular file")
    return path


def file_or_directory(text: str) -> Path:
    """An existing regular file or directory (a checkpoint directory or its config.json); nothing else."""
    path, mode = _stat(text, missing="no such file or directory")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise argparse.ArgumentTypeError(f"{text}: {file_kind(mode)}, not a file or directory")
    return path


def _stat(text: str, *, missing: str) -> tuple[Path, int]:
    """The path `text` names (~ expanded) and its file mode, from `stat` alone (nothing is opened); an empty
    argument, a missing path (`missing` says what was looked for) or one that cannot be read is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    path = Path(text).expanduser()
    try:
        return path, path.stat().st_mode
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{text}: {missing}") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot read ({exc.strerror or exc})") from None


def output_path(text: str) -> str:
    """Where a command writes its output, checked before any work starts: ``-`` (standard output), or a regular
    file (new or existing) in a directory this user can write (tried by creating and removing an empty file there,
    as the atomic writer will). A directory, a device or a FIFO is refused (an atomic write would replace it); so
    is a place that cannot be written. Returned as given, for the writer."""
    if text == STDOUT:
        return text
    return _check_output(text, hint=" (use - for standard output)")


def output_file(text: str) -> str:
    """`output_path` without ``-``: a file that is written while the screen is in use (``--record``)."""
    if text == STDOUT:
        raise argparse.ArgumentTypeError("needs a file: standard output is the screen here")
    return _check_output(text, hint="")


def _check_output(text: str, hint: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty{hint}")
    path = Path(text).expanduser().resolve()  # "missing/../x" names x, as the writer will reach it
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write ({exc.strerror or exc})") from None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise argparse.ArgumentTypeError(f"{text}: {file_kind(info.st_mode)}, not a file to write{hint}")
        if not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text}: cannot write (Permission denied)")
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: cannot write ({parent} is not a directory)")
    try:  # the one sure test, root and read-only file systems included: create a file there and remove it
        fd, probe = tempfile.mkstemp(prefix=".decodetop-write-check-", dir=parent)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {parent} ({exc.strerror or exc})") from None
    os.close(fd)
    Path(probe).unlink()
    return text


def _nearest_existing(directory: Path) -> Path:
    """`directory` or its closest ancestor that exists (the writer creates the rest)."""
    current = directory if str(directory) else Path()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as a container or taskset limits it), else the count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def check_cpu_ranks(count: int | None, *, force: bool, cpu_count: int | None = None) -> None:
    """Refuse more CPU ranks than the machine has CPUs unless `force`: each rank is a process that spins on a
    core, so more ranks than cores time-slice each other and measure the scheduler, not the method."""
    if count is None:
        return
    cpus = cpu_count if cpu_count is not None else usable_cpus()
    if count > cpus and not force:
        raise UserInputError(
            f"--cpu-ranks {count}: more than the {cpus} CPUs of this machine (add --force to run anyway)"
        )
