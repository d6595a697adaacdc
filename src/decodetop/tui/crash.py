"""Provides the live UI's crash report: an exception nothing handled ends the app with a non-zero exit code, one line
on standard error and the whole traceback in a log file under the state dir (``logs/ui-crash-<time>-<pid>.log``).

Textual's own report (a full-screen traceback with locals, then exit code 0 from `decodetop`) is replaced: a script
or a supervisor sees the failure, and the person at the terminal sees what broke and where the details are.

    app._handle_exception → CrashReport.record(error)   # once, the first exception: writes the log
    commands/tui.py       → raise UiCrashError(report.line) when report.crash is set
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from decodetop.errors import DecodetopError
from decodetop.inert import inert
from decodetop.paths import state_dir

CRASH_EXIT = 70
"""Exit code after an internal error of the live UI: EX_SOFTWARE of sysexits.h (https://man.freebsd.org/sysexits),
apart from 1 (a warning finding of `check`) and 2 (bad input)."""
MAX_SUMMARY_CHARS = 200
"""Characters of the exception's message in the one line (the log holds all of it)."""


class UiCrashError(DecodetopError):
    """The live UI stopped on an internal error; the message names it and the crash log."""

    exit_code = CRASH_EXIT


@dataclass(frozen=True)
class Crash:
    """One recorded crash: what it was and where its traceback is."""

    summary: str
    """`Type: message`, inert and cut to `MAX_SUMMARY_CHARS`."""
    log_path: Path | None
    """The crash log, or None when no log could be written anywhere."""

    @property
    def line(self) -> str:
        """The one line for standard error."""
        where = f"the traceback is in {self.log_path}" if self.log_path else "no crash log could be written"
        return f"the live UI stopped on an internal error ({self.summary}); {where}"


def _summary(error: BaseException) -> str:
    text = inert(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[: MAX_SUMMARY_CHARS - 1] + "…"


def _log_text(error: BaseException, now_s: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now_s))
    body = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return f"decodetop live UI crash at {stamp}, pid {os.getpid()}\n\n{inert_log(body)}"


def inert_log(text: str) -> str:
    """A traceback with the controls of outside text in it marked, newlines kept (`cat` of the log is safe)."""
    return "\n".join(inert(line) for line in text.split("\n"))


def write_crash_log(error: BaseException, directory: Path | None = None, now_s: float | None = None) -> Crash:
    """Write `error`'s traceback to a new file under `directory` (default: the state dir's ``logs``; the temporary
    directory when that cannot be written) and return the crash it describes."""
    moment = time.time() if now_s is None else now_s
    name = f"ui-crash-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(moment))}-{os.getpid()}.log"
    text = _log_text(error, moment)
    places = [directory] if directory is not None else [state_dir() / "logs", Path(tempfile.gettempdir())]
    for place in places:
        try:
            place.mkdir(parents=True, exist_ok=True)
            fd = os.open(place / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError:
            continue
        return Crash(_summary(error), place / name)
    return Crash(_summary(error), None)


class CrashReport:
    """The first unhandled exception of an app, recorded once (a crash log) and said once."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self.crash: Crash | None = None

    def record(self, error: BaseException) -> None:
        """Write the crash log of the first exception (later ones follow from it and are left out)."""
        if self.crash is None:
            self.crash = write_crash_log(error, self._directory)

    def raise_if_crashed(self) -> None:
        """`UiCrashError` with the one line when a crash was recorded."""
        if self.crash is not None:
            raise UiCrashError(self.crash.line)
