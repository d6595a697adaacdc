"""Provides the one check for numbers from outside (a flag, a settings file, a JSON file, a server's /metrics): a
`Quantity` knows its range and unit, and `Quantity.check` turns anything else into one line naming the place.

A number a user or a server hands us can be NaN or infinite, an integer with hundreds of digits (``float()`` of it
raises `OverflowError`, which is not a `ValueError`, so a reader's ``except ValueError`` misses it), or finite but
absurd: ``--target-tps 1e-320`` makes the target step infinite, ``--observed-ms 1e308`` overflows the first sum it
enters. `as_float` converts without raising; `Quantity.check` refuses what is outside the quantity's range, so no
figure downstream can overflow or print 300 digits.

Stdlib only, at the bottom of the package: every layer may use it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from decodetop.errors import UserInputError
from decodetop.inert import inert


class QuantityError(UserInputError):
    """A number outside its quantity's range, or not a number: one line naming where it came from."""


def as_float(value: object) -> float | None:
    """`value` as a float when it is a number that fits one (an int, a float, a numeric string); None for a bool,
    anything else, or an integer too large for a float. NaN and infinity come back as they are (the caller's range
    refuses them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str) and len(value.strip()) > 64:  # no float needs more; nor is a 4,000-digit string read
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


def shown(value: object) -> str:
    """A short, inert rendering of a bad value for a message (a 4,000-digit integer is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        digits = len(str(abs(value))) if value.bit_length() < 14_000 else int(value.bit_length() * 0.30103) + 1
        return f"a number with {digits} digits"
    text = repr(value) if isinstance(value, str) else str(value)
    text = inert(text)
    return text if len(text) <= 40 else text[:39] + "…"


def _figure(value: float) -> str:
    if value == int(value) and abs(value) < 1e12:
        return f"{int(value):,}"
    return f"{value:g}"


@dataclass(frozen=True)
class Quantity:
    """A kind of number with the range a value of it must fall in (inclusive) and its unit."""

    name: str
    """What it is, for messages ("observed step")."""
    low: float
    high: float
    unit: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"quantity {self.name}: bad range {self.low}..{self.high}")

    @property
    def range_text(self) -> str:
        """ "from 0.001 to 3,600,000 ms"."""
        unit = f" {self.unit}" if self.unit else ""
        return f"from {_figure(self.low)} to {_figure(self.high)}{unit}"

    def accepts(self, value: float) -> bool:
        """True for a finite value inside the range."""
        return math.isfinite(value) and self.low <= value <= self.high

    def check(self, value: object, where: str) -> float:
        """`value` as a float when it is a number in range; else `QuantityError`
        ``"<where> must be a number from <low> to <high> <unit>, got <value>"``."""
        number = as_float(value) if not isinstance(value, str) else None
        if number is None or not self.accepts(number):
            raise QuantityError(f"{where} must be a number {self.range_text}, got {shown(value)}")
        return number

    def check_int(self, value: object, where: str) -> int:
        """`check` for a whole number (a bool or a float is refused)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise QuantityError(f"{where} must be a whole number {self.range_text}, got {shown(value)}")
        if not self.low <= value <= self.high:
            raise QuantityError(f"{where} must be a whole number {self.range_text}, got {shown(value)}")
        return value

    def arg(self, text: str) -> float:
        """An argparse `type=`: the flag's text as a number in range, else `argparse.ArgumentTypeError`."""
        number = as_float(text)
        if number is None:
            raise argparse.ArgumentTypeError(f"not a number: {shown(text)}")
        if not self.accepts(number):
            raise argparse.ArgumentTypeError(f"must be a number {self.range_text}, got {shown(text)}")
        return number


# The ranges. Each is far wider than any real value and narrow enough that no sum, product or reciprocal of values
# in range overflows a float or underflows to 0.
OBSERVED_MS = Quantity("observed step", 0.001, 3_600_000.0, "ms")
"""A decode step: 1 µs (far below any kernel launch, docs/reference/probes.md §3: a graph node ~0.6 µs) to an hour
(a CPU-rank run of a large model is seconds)."""
TARGET_TPS = Quantity("target throughput", 0.001, 10_000_000.0, "tok/s")
"""Tokens per second of one stream: one token in 1000 s to 10 M/s (the fastest single-stream decode is thousands)."""
TICK_S = Quantity("telemetry period", 0.25, 3600.0, "s")
"""The live UI's tick: nvitop's shortest refresh (docs/reference/peers.md §2) to an hour."""
TIMEOUT_S = Quantity("deadline", 0.001, 7 * 24 * 3600.0, "s")
"""A deadline or a wait: above 0, at most a week."""
COMPONENT_MS = Quantity("time", 0.0, 3_600_000.0, "ms")
"""A budget component's time or a step's spread: 0 to an hour (as `OBSERVED_MS`)."""
ACCEPT_LENGTH = Quantity("accept length", 1.0, 1024.0, "tokens per step")
"""Speculative decoding's tokens per step: at least 1; no drafter proposes a thousand."""
UNIX_TIME_S = Quantity("time", 0.0, 1e11, "s since 1970")
"""When something was recorded or saved: from the epoch to the year 5138 (a crafted time must not overflow an age
or a date)."""
