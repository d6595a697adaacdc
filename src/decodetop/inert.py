"""Provides `inert`: text from outside (a file, a server, a trace, a replay, the history) made safe to show.

A kernel name, an HTTP reason phrase or a replayed GPU name is data, never code. Printed as it is, an ESC byte
starts a terminal escape sequence (OSC 0 sets the window title, CSI 2J clears the screen, OSC 52 writes the
clipboard, OSC 8 makes a link), a carriage return or backspace overwrites what was printed before, and a newline
breaks a table or a one-line error. `inert` replaces each of these characters with a visible mark:

- C0 controls (U+0000–U+001F) and DEL: their Unicode control pictures (ESC shows as ``␛``, a newline as ``␊``);
- C1 controls (U+0080–U+009F, where U+009B is a one-byte CSI in some terminals): ``\\u009b``;
- the line and paragraph separators (U+2028, U+2029) and the bidirectional overrides, embeddings, isolates and marks
  that reorder what a reader sees (the "Trojan Source" characters, CVE-2021-42574): ``\\u202e``;
- lone surrogates (from JSON ``"\\ud800"``), which no encoder can write (printing one raises UnicodeEncodeError):
  U+FFFD.

Everything else, any script and any emoji, is kept as it is. The live UI shows the result as a Rich ``Text``
(never parsed as markup: `decodetop.tui` wraps it); the headless commands print it, and `guard_streams` filters
standard output and error of every headless command as a last line of defence.

Stdlib only, at the bottom of the package: every layer may use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Arabic letter mark, LRM, RLM, the embeddings and overrides (LRE…RLO) and the isolates (LRI…PDI)."""
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}\ud800-\udfff]")
"""Every character `inert` replaces."""
_UNSAFE_IN_STREAM = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{_BIDI}\ud800-\udfff]")
"""What `guard_streams` replaces: the same, but newlines and tabs stay (they lay out the command's own output)."""
MARK_LONE_SURROGATE = "\ufffd"


def _mark(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the control pictures block: U+2400 ␀ … U+241F ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    if 0xD800 <= code <= 0xDFFF:
        return MARK_LONE_SURROGATE
    return f"\\u{code:04x}"  # also a valid JSON escape: a --json document stays valid JSON


_MARKS = {chr(code): _mark(chr(code)) for code in (*range(0x20), *range(0x7F, 0xA0))}


def _replace(match: re.Match[str]) -> str:
    char = match.group()
    return _MARKS.get(char) or _mark(char)


def inert(text: object) -> str:
    """`text` (anything, `str()` of it) with every control, separator, bidirectional control and lone surrogate
    replaced by a visible mark: safe to print on a terminal and one line long."""
    value = text if isinstance(text, str) else str(text)
    if _UNSAFE.search(value) is None:  # the usual case: nothing to replace, no copy
        return value
    return _UNSAFE.sub(_replace, value)


def is_inert(text: str) -> bool:
    """True when `inert(text)` would return `text` unchanged."""
    return _UNSAFE.search(text) is None


def inert_lines(text: object) -> str:
    """`inert`, keeping newlines and tabs: for text of several lines a command lays out itself."""
    value = text if isinstance(text, str) else str(text)
    if _UNSAFE_IN_STREAM.search(value) is None:
        return value
    return _UNSAFE_IN_STREAM.sub(_replace, value)


def inert_data(value: T) -> T:
    """`value` with every string in it made `inert`: the strings themselves, and those inside tuples, lists, dicts
    (keys too) and dataclass instances, however deep. What holds no string to change comes back as the same object
    (a steady telemetry tick copies nothing); an enum member or any other object is left as it is.

    The live UI passes what it takes from outside (a telemetry frame, check results, a trace's view, probe results
    from the history or a replay) through this before a widget sees it, so no widget can show a control."""
    return _inert_data(value)  # type: ignore[no-any-return]


def _inert_data(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return inert(value)
    if kind is tuple or kind is list:
        items = [_inert_data(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else kind(items)
    if kind is dict:
        pairs = [(_inert_data(k), _inert_data(v)) for k, v in value.items()]
        same = all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True))
        return value if same else dict(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for field in dataclasses.fields(value):
            if field.init:
                old = getattr(value, field.name)
                new = _inert_data(old)
                if new is not old:
                    changed[field.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    return value


class InertStream:
    """A text stream that writes through `inert_lines`: nothing written to it can reach the terminal as a control
    sequence. Every other attribute (``fileno``, ``isatty``, ``buffer``, ``encoding``) is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def wrapped(self) -> TextIO:
        """The stream written to."""
        return self._stream

    def write(self, text: str) -> int:
        """Write `text` with its controls marked; returns the length of `text` (as `TextIO.write` does)."""
        self._stream.write(inert_lines(text))
        return len(text)

    def writelines(self, lines: Iterator[str] | list[str]) -> None:
        """`write` each of `lines`."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guard_streams() -> Iterator[None]:
    """Standard output and error filtered by `InertStream` while inside (the headless commands run inside it);
    the streams in place before are back afterwards."""
    saved_out, saved_err = sys.stdout, sys.stderr
    sys.stdout = InertStream(saved_out)
    sys.stderr = InertStream(saved_err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved_out, saved_err
