"""The recipe for a new panel holds: a panel written only as its widget module and its source module, plus one
`Panel(...)` line in `tui.layout.PANELS`, gets a tab, a number key and a line in `?`, and shows what its source read
(in a worker thread) — no other file names it."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
from textual.widgets import Static, TabbedContent

from decodetop.tui import layout
from decodetop.tui.screens.help import HelpScreen

from .conftest import make_app, wait_until
from .fakes import make_sources

#: The toy's source: what it reads, off the event loop (here a file the test writes).
SOURCE_MODULE = '''
"""Provides the toy panel's source: one line read from a file."""

from __future__ import annotations

from pathlib import Path


class ToySource:
    """Reads the toy's line (blocking: called from a worker thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> str:
        return self.path.read_text().strip()
'''

#: The toy's widget: it reads its source in a thread worker and shows the line (inert text, CSS beside it).
WIDGET_MODULE = '''
"""Provides the toy panel: its source's line."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.widgets import Static

from toy_panel_source import ToySource


class ToyPanel(Static, can_focus=True):
    DEFAULT_CSS = "ToyPanel { height: auto; color: $foreground; }"

    def __init__(self, source: ToySource, **kwargs: object) -> None:
        super().__init__("reading the toy source…", **kwargs)
        self.source = source

    def on_mount(self) -> None:
        self.read()

    @work(thread=True, exit_on_error=False)
    def read(self) -> None:
        line = self.source.read()
        self.app.call_from_thread(self.update, Text(line))
'''


async def test_a_panel_from_its_own_modules_and_one_layout_line_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toy_panel_source.py").write_text(textwrap.dedent(SOURCE_MODULE))
    (tmp_path / "toy_panel_widget.py").write_text(textwrap.dedent(WIDGET_MODULE))
    (tmp_path / "toy.txt").write_text("toy source says [b]hello[/b]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    widget = importlib.import_module("toy_panel_widget")
    source = sys.modules["toy_panel_source"]

    # the one line of layout
    path = tmp_path / "toy.txt"
    toy = layout.Panel("toy", "Toy", lambda s: [widget.ToyPanel(source.ToySource(path), id="toy-panel")], "#toy-panel")
    monkeypatch.setattr(layout, "PANELS", (*layout.PANELS, toy))

    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)) as pilot:
        number = str(len(layout.PANELS))
        await pilot.press(number)
        await wait_until(pilot, lambda: app.query_one(TabbedContent).active == "toy", "the toy's number key")
        panel = app.query_one("#toy-panel", Static)
        await wait_until(pilot, lambda: "hello" in str(panel.render()), "the toy source's line on screen")
        assert str(panel.render()) == "toy source says [b]hello[/b]"  # outside text shown inert
        assert app.focused is panel
        assert f"Toy {number}" in str(app.query_one(TabbedContent).get_tab("toy").label)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        assert (number, "Toy tab") in app.screen.keys  # type: ignore[attr-defined]
