"""Provides the unexplained remainder in words, the same on every surface (the UI's budget box, the CLI's table, the
exporter's help): a negative remainder is said as the components exceeding the observed step, never as a negative
number or a clamped 0."""

from __future__ import annotations

from decodetop.textfmt import format_ms

EXCEEDS_OBSERVED = "the components exceed the observed step by"
"""How every surface says a negative unexplained remainder (the parts add up to more than the observed step: a slower
host than the server's, CPU ranks, an assumed observed step): never as a negative number or a clamped 0."""


def remainder_text(unexplained_ms: float, *, complete: bool = True) -> str:
    """The unexplained remainder in words, the same on every surface: "unexplained 79.0 ms" ("at most …" when some
    components have no figure), or "the components exceed the observed step by 12.4 s"."""
    if unexplained_ms < 0:
        return f"{EXCEEDS_OBSERVED} {format_ms(-unexplained_ms)}"
    return f"unexplained {'' if complete else 'at most '}{format_ms(unexplained_ms)}"
