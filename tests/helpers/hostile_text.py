"""Hostile text for the tests of every surface that shows text from outside: terminal escape sequences, C1
controls, carriage returns, bidirectional overrides and Rich markup, and a hypothesis strategy mixing them with
arbitrary text. `assert_inert` is the one check: no ESC, no C1 control, no separator or bidi control and no control
but newline and tab in what reached the output."""

from __future__ import annotations

import re

from hypothesis import strategies as st

UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
"""What must never reach the output (newline and tab lay out a command's own text)."""
ESCAPES = [
    "\x1b]0;PWNED\x07",  # OSC 0: the window title
    "\x1b[2J\x1b[H",  # CSI: clear the screen, cursor home
    "\x1b]52;c;ZWNobyBwd25lZA==\x07",  # OSC 52: write the clipboard
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\",  # OSC 8: a hyperlink
    "\x9b2J",  # C1 CSI
    "\x9d0;title\x9c",  # C1 OSC … ST
    "over\rwrite\x08\x08",  # carriage return, backspace
    "\u202eevil\u202c",  # right-to-left override
]
MARKUP = ["[bold red]red[/bold red]", "[/oops]", "[link=https://evil.example]x[/link]", "[@click=app.quit]q[/]"]
PIECES = [*ESCAPES, *MARKUP, "a", " ", "é", "漢", "\n", "\t"]
hostile_text = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from(ESCAPES + MARKUP),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join),
)
"""Arbitrary text, the escapes and the markup above, and mixes of them."""


def assert_inert(text: str) -> None:
    """Fail when `text` holds ESC or any other character a terminal must not receive as it is."""
    assert "\x1b" not in text
    found = UNSAFE.search(text)
    assert found is None, f"{found.group()!r} reached the output: {text!r}"
