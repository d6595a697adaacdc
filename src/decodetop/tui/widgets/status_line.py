"""Provides StatusLine: one line of text that repaints without a layout pass (a `Static.update` re-lays out the
screen, which a line that changes every telemetry tick cannot afford)."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from decodetop.inert import inert


class StatusLine(Widget):
    """A single line; set `text`."""

    DEFAULT_CSS = """
    StatusLine { height: 1; color: $state-muted; padding: 0 1; }
    """

    text: reactive[str] = reactive("")
    """What the line says (cut at the width)."""

    def render(self) -> Text:
        """The text on one line, ending in "…" where it is cut (server and file text: controls marked)."""
        text = Text(inert(self.text), no_wrap=True, overflow="ellipsis")
        width = self.content_region.width
        if width and text.cell_len > width:
            text.truncate(width, overflow="ellipsis")
        return text
