"""Provides HelpScreen: every key binding of the app, listed from the bindings themselves (`?`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    """A modal listing keys and what they do; any of escape, q, ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 72; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "close", show=False)]

    def __init__(self, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = list(keys)
        """(key, description) rows."""

    def compose(self) -> ComposeResult:
        """The key table."""
        table = Table(box=None, show_header=False, expand=True, padding=(0, 1))
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("what")
        for key, what in self.keys:
            table.add_row(key, what)
        with VerticalScroll() as scroll:
            scroll.border_title = "keys"
            yield Static(table)
