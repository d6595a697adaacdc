"""Provides `inert_text`: text from outside as a Rich `Text` a widget shows as it is.

A string handed to `Static`, `Static.update`, a `DataTable` cell or `App.notify` is parsed as Textual markup:
``[bold red]`` from a kernel name would render, ``[link=…]`` would make a link and a stray ``[/oops]`` raises
`MarkupError` and ends the app. A `Text` is never parsed, and `decodetop.inert` marks every control in it, so an
ESC byte from a trace, a replay or a server never reaches the terminal. Data from outside enters the UI's view types
through `decodetop.inert.inert_data` (the sources); what a widget builds from it is shown through `inert_text`.
"""

from __future__ import annotations

from rich.text import Text

from decodetop.inert import inert, inert_lines


def inert_text(value: object, style: str = "", *, lines: bool = False) -> Text:
    """`value` (`str()` of it) as a `Text` with every control marked: never markup, never an escape sequence.
    With `lines`, newlines and tabs are kept (a note of several lines the UI lays out itself)."""
    return Text(inert_lines(value) if lines else inert(value), style=style)
