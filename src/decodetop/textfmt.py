"""Provides plain-text tables and unit formatting for the headless commands (stdlib only)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """Render a fixed-width table. `align` holds one of 'l'/'r' per column (default: numbers right, text left)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    if align is None:
        align = "".join(
            "r" if rows and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) else "l"
            for i in range(len(headers))
        )

    def fmt(row: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if align[i] == "r" else v.ljust(widths[i]) for i, v in enumerate(row)]
        return "  ".join(parts).rstrip()

    lines = [fmt(list(headers)), "  ".join("-" * w for w in widths)]
    lines.extend(fmt(row) for row in cells)
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def format_number(value: float, digits: int = 3) -> str:
    """Three significant digits, no scientific notation for everyday magnitudes."""
    if math.isnan(value):
        return "-"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:.{decimals}f}"


def format_bytes(n_bytes: float) -> str:
    """Binary units: 8 B, 12 KiB, 256 MiB."""
    value = float(n_bytes)
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
