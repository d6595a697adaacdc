"""Provides plain-text tables and unit formatting for the headless commands (stdlib only).

Tables fit the terminal: where the natural width is wider than `terminal_width()`, the text columns (left-aligned)
narrow and their cells wrap onto continuation lines; numbers (right-aligned columns) are never cut. Output that is
not a terminal (a pipe, a file) keeps whole lines unless ``COLUMNS`` says otherwise, so ``grep`` sees every word;
the full text is always in ``--json``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence

from decodetop.inert import inert, inert_lines

MIN_TEXT_COLUMN = 10
"""Narrowest a text column is squeezed to (a word of ten characters still fits on one line)."""
GAP = "  "
"""Between columns."""


_RESERVED = contextvars.ContextVar("decodetop_textfmt_reserved", default=0)
"""Columns taken by an indent the caller adds around tables rendered elsewhere (`reserved_columns`)."""


@contextlib.contextmanager
def reserved_columns(columns: int) -> Iterator[None]:
    """Tables rendered inside leave `columns` free at the left: for text that a caller indents afterwards."""
    token = _RESERVED.set(_RESERVED.get() + columns)
    try:
        yield
    finally:
        _RESERVED.reset(token)


def terminal_width() -> int | None:
    """Columns to fit in: ``COLUMNS`` when set to a positive number, else the terminal's width when standard output
    is one, else None (no limit: output for a pipe or a file is not cut)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if not sys.stdout.isatty():
            return None
        return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except (OSError, ValueError, AttributeError):  # no real stdout (captured, closed)
        return None


def _numeric_column(rows: Sequence[Sequence[object]], i: int) -> bool:
    return bool(rows) and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)


MAX_WORD = 20
"""A word longer than this (a path, a kernel name) may break; shorter ones keep their column at least as wide."""
ESTIMATE_WORK = 20_000
"""Rows × characters to remove up to which the narrowing estimates wrapped lines (a few tens of milliseconds);
beyond it, the widest column narrows first."""


def _fit_widths(natural: list[int], shrinkable: list[bool], room: int, cells: list[list[str]]) -> list[int]:
    """Narrow the shrinkable columns, one character at a time, until the row fits in `room` (or none can narrow
    further: then the table is as narrow as it goes). Each character comes from the column where losing it adds
    the fewest wrapped lines (estimated as ceil(length / width) a cell, a row as tall as its tallest cell), the
    widest on a tie, so long text takes the wrap and short labels stay on one line."""
    widths = list(natural)
    excess = sum(widths) + len(GAP) * (len(widths) - 1) - room
    lengths = [[len(row[i]) for row in cells] for i in range(len(natural))]
    floors = [  # never narrower than a column's longest word (up to MAX_WORD), so words do not break
        min(natural[i], max([MIN_TEXT_COLUMN] + [min(len(w), MAX_WORD) for row in cells for w in row[i].split()]))
        for i in range(len(natural))
    ]

    def cost_with(column: int, width: int) -> int:
        total = 0
        for r in range(len(cells)):
            heights = [
                -(-lengths[j][r] // (width if j == column else widths[j])) if shrinkable[j] else 1
                for j in range(len(widths))
            ]
            total += max(heights)
        return total

    estimate = len(cells) * max(excess, 0) <= ESTIMATE_WORK
    while excess > 0:
        candidates = [i for i, ok in enumerate(shrinkable) if ok and widths[i] > floors[i]]
        if not candidates:  # no room for whole words: break them, down to MIN_TEXT_COLUMN
            candidates = [i for i, ok in enumerate(shrinkable) if ok and widths[i] > min(natural[i], MIN_TEXT_COLUMN)]
        if not candidates:
            break
        if estimate:
            best = min(candidates, key=lambda i: (cost_with(i, widths[i] - 1), -widths[i]))
        else:  # a huge table: narrow the widest column, in linear time
            best = max(candidates, key=lambda i: widths[i])
        widths[best] -= 1
        excess -= 1
    return widths


def _wrap_cell(text: str, width: int, max_lines: int | None) -> list[str]:
    if len(text) <= width:
        return [text]
    lines = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 1].rstrip() + "…"
    return lines


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    align: str | None = None,
    *,
    width: int | None = -1,
    indent: int = 0,
    max_lines: int | None = None,
    row_notes: Sequence[Sequence[str]] | None = None,
) -> str:
    """Render a fixed-width table. `align` holds one of 'l'/'r' per column (default: numbers right, text left).

    `width` is the room in columns (default: `terminal_width()`; None: no limit). When the table is wider, text
    columns narrow and wrap (at most `max_lines` lines a cell, the last ending in "…"); right-aligned columns keep
    their width. `indent` spaces start every line and count against the width. `row_notes[i]`, when given, are
    lines printed under row i (details that span the table). Every header, cell and note is shown inert
    (`decodetop.inert`): a control character in a kernel name never reaches the terminal."""
    headers = [inert(h) for h in headers]
    cells = [[_cell(v) for v in row] for row in rows]
    natural = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            natural[i] = max(natural[i], len(value))
    if align is None:
        align = "".join("r" if _numeric_column(rows, i) else "l" for i in range(len(headers)))
    room = terminal_width() if width == -1 else width
    widths = natural
    if room is not None:
        widths = _fit_widths(natural, [a == "l" for a in align], room - indent - _RESERVED.get(), cells)
    pad = " " * indent

    def fmt(row: Sequence[str]) -> list[str]:
        wrapped = [_wrap_cell(v, widths[i], max_lines) if align[i] == "l" else [v] for i, v in enumerate(row)]
        out = []
        for k in range(max(len(w) for w in wrapped)):
            parts = [
                (w[k] if k < len(w) else "").rjust(widths[i])
                if align[i] == "r"
                else (w[k] if k < len(w) else "").ljust(widths[i])
                for i, w in enumerate(wrapped)
            ]
            out.append((pad + GAP.join(parts)).rstrip())
        return out

    lines = fmt(list(headers))
    lines.append(pad + GAP.join("-" * w for w in widths))
    for number, row in enumerate(cells):
        lines.extend(fmt(row))
        if row_notes is not None and number < len(row_notes):
            lines.extend(inert_lines(note) for note in row_notes[number])
    return "\n".join(lines)


def fit_text(text: str, width: int | None = -1) -> str:
    """`text` with every line longer than `width` (default: `terminal_width()`) wrapped at word boundaries; the
    continuation lines keep the line's indent plus two spaces. Lines that fit, tables included, are unchanged.
    Controls other than newlines and tabs are marked (`decodetop.inert.inert_lines`)."""
    text = inert_lines(text)
    room = terminal_width() if width == -1 else width
    if room is None:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= room:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        if len(lead) + 2 > room // 2:  # a deep indent would leave no room for words
            lead = ""
        out.extend(
            textwrap.wrap(
                line.strip(),
                room,
                initial_indent=lead,
                subsequent_indent=lead + "  ",
                break_long_words=True,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def shorten(text: object, width: int) -> str:
    """`text` inert and at most `width` characters, the last one "…" when it was cut (a name from a trace can be a
    million characters long)."""
    value = inert(text)
    return value if len(value) <= width else value[: max(width - 1, 0)] + "…"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_number(value)
    return inert(value)


SCIENTIFIC_ABOVE = 1e15
"""Magnitudes from here up print in scientific notation (no figure of decodetop's is that large; a crafted one
must not print 300 digits)."""
SCIENTIFIC_BELOW = 1e-9
"""And magnitudes below this (a nanosecond in seconds): 0.000000001 is harder to read than 1e-09."""


def format_number(value: float, digits: int = 3) -> str:
    """Three significant digits, no scientific notation for everyday magnitudes; never raises (infinity prints as
    "inf", NaN as "-", the extremes in scientific notation)."""
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if not SCIENTIFIC_BELOW <= abs(value) < SCIENTIFIC_ABOVE:
        return f"{value:.{max(digits - 1, 0)}e}"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:.{decimals}f}"


def format_ms(value_ms: float, *, space: bool = True) -> str:
    """A duration given in ms, in the unit that reads best and never in scientific notation: "0.412 ms", "95.0 ms",
    "1.99 s" (from 1000 ms), "39.3 µs" (below 0.01 ms), "5.00 ns"; `space=False` gives the compact "0.412ms"."""
    if not math.isfinite(value_ms):
        return "-"
    size = abs(value_ms)
    if size >= 1000:
        number, unit = value_ms / 1000, "s"
    elif size >= 0.01 or size == 0:
        number, unit = value_ms, "ms"
    elif size >= 1e-5:
        number, unit = value_ms * 1000, "µs"
    else:
        number, unit = value_ms * 1e6, "ns"
    return f"{format_number(number)}{' ' if space else ''}{unit}"


def format_bytes(n_bytes: float) -> str:
    """Binary units: 8 B, 12 KiB, 256 MiB (never raises: a value no float holds prints as "inf B")."""
    try:
        value = float(n_bytes)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        return f"{format_number(value)} B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{format_number(value)} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration_us(time_us: float) -> str:
    """µs below a millisecond, ms below a second, s above."""
    if time_us < 1000:
        return f"{format_number(time_us)} µs"
    if time_us < 1_000_000:
        return f"{format_number(time_us / 1000)} ms"
    return f"{format_number(time_us / 1_000_000)} s"


def parse_size(text: str) -> int:
    """Parse '8', '12K', '12KiB', '256M', '1G' (binary multiples) into bytes; raise ValueError on anything else."""
    raw = text.strip()
    units = {
        "": 1,
        "B": 1,
        "K": 1024,
        "KB": 1024,
        "KIB": 1024,
        "M": 1024**2,
        "MB": 1024**2,
        "MIB": 1024**2,
        "G": 1024**3,
        "GB": 1024**3,
        "GIB": 1024**3,
    }
    number = raw.rstrip("bBkKmMgGiI")
    suffix = raw[len(number) :].upper()
    if suffix not in units or not number:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 12K, 256M, 1G)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 12K, 256M, 1G)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    result = int(value * units[suffix])
    if result <= 0:
        raise ValueError(f"size must be at least 1 byte: {text!r}")
    return result
