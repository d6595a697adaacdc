"""An exception nothing handled in the live UI ends `decodetop` with exit 70 (EX_SOFTWARE), one inert line on
standard error naming the crash log, and the traceback in that log under the state dir. On main the dead app exited 0,
so scripts and supervisors saw success. The real app runs headless here, over the fixed UI sources; the crash is an
exception raised on the event loop (with escapes and markup in its message, as a crafted input would carry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.app import App

from decodetop.cli import main
from decodetop.tui.app import DecodetopApp
from decodetop.tui.crash import CRASH_EXIT
from tests.helpers.hostile_text import assert_inert
from tests.tui.fakes import make_sources

BOOM = "boom \x1b]0;PWNED\x07 [/oops]"


def test_an_internal_error_of_the_ui_is_exit_70_one_line_and_a_crash_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def crash(self: DecodetopApp) -> None:
        raise RuntimeError(BOOM)

    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("decodetop.tui.launch.build_sources", lambda settings, options: make_sources())
    monkeypatch.setattr("decodetop.tui.launch.require_terminal", lambda stdin, stdout, environ: None)
    monkeypatch.setattr(DecodetopApp, "run", lambda self: App.run(self, headless=True, size=(120, 40)))
    monkeypatch.setattr(DecodetopApp, "set_status", crash)  # the first telemetry frame calls it: no key pressed
    settings = tmp_path / "settings.toml"
    settings.write_text('model = "glm-5"\n')
    code = main(["--no-probes", "--settings", str(settings)])
    err = capsys.readouterr().err
    assert code == CRASH_EXIT == 70, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert_inert(err)
    assert "the live UI stopped on an internal error (RuntimeError: boom ␛]0;PWNED␇ [/oops])" in lines[0]
    found = re.search(r"the traceback is in (\S+\.log)", lines[0])
    assert found is not None, lines[0]
    log = Path(found.group(1))
    assert log.parent == tmp_path / "state" / "logs"
    text = log.read_text(encoding="utf-8")
    assert "Traceback" in text and "RuntimeError: boom ␛]0;PWNED␇" in text
    assert_inert(text)
