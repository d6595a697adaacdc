"""Provides the built-in themes as data: the base colours and decodetop's semantic variables for each.

Variables (used from CSS as `$name`):
- `seg-<component>` (the `Component` value with `_` → `-`) and `seg-unexplained`: the budget bar's segments;
- `mark-observed`, `mark-target`, `mark-roofline`: the budget bar's markers;
- `state-ok`, `state-warn`, `state-bad`, `state-running`, `state-muted`: statuses in tables and panels.
"""

from __future__ import annotations

from dataclasses import dataclass

from decodetop.budget.components import UNEXPLAINED_KEY, Component


def segment_variable(key: str) -> str:
    """Theme variable of a budget segment: "seg-attention-proj" for Component.ATTENTION_PROJ's key."""
    return "seg-" + key.replace("_", "-")


SEGMENT_KEYS: tuple[str, ...] = (*(c.value for c in Component), UNEXPLAINED_KEY)
"""Every budget segment key, in legend order."""


@dataclass(frozen=True)
class Palette:
    """One theme's colours: Textual's base colours and decodetop's semantic variables."""

    name: str
    dark: bool
    primary: str
    secondary: str
    accent: str
    foreground: str
    background: str
    surface: str
    panel: str
    warning: str
    error: str
    success: str
    segments: tuple[str, ...]
    """One colour per SEGMENT_KEYS entry (the last is the unexplained remainder)."""
    observed: str
    target: str
    roofline: str
    running: str
    muted: str

    def variables(self) -> dict[str, str]:
        """decodetop's semantic theme variables for this palette."""
        if len(self.segments) != len(SEGMENT_KEYS):
            raise ValueError(f"theme {self.name}: {len(self.segments)} segment colours for {len(SEGMENT_KEYS)} keys")
        out = {segment_variable(key): colour for key, colour in zip(SEGMENT_KEYS, self.segments, strict=True)}
        out.update(
            {
                "mark-observed": self.observed,
                "mark-target": self.target,
                "mark-roofline": self.roofline,
                "state-ok": self.success,
                "state-warn": self.warning,
                "state-bad": self.error,
                "state-running": self.running,
                "state-muted": self.muted,
            }
        )
        return out


# Tableau 10 (Tableau's default categorical palette), which reads well on a dark background.
_TABLEAU10 = (
    "#4e79a7",
    "#59a14f",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

DARK = Palette(
    name="decodetop-dark",
    dark=True,
    primary="#4e79a7",
    secondary="#76b7b2",
    accent="#f28e2b",
    foreground="#e0e0e0",
    background="#121417",
    surface="#1b1e23",
    panel="#252a31",
    warning="#edc948",
    error="#ff5f5f",
    success="#59a14f",
    segments=(*_TABLEAU10, "#5a5a5a"),
    observed="#ff5f5f",
    target="#59e05f",
    roofline="#6fb8ff",
    running="#76b7b2",
    muted="#8a8f98",
)

LIGHT = Palette(
    name="decodetop-light",
    dark=False,
    primary="#2f5d8c",
    secondary="#3b8a85",
    accent="#c05a00",
    foreground="#1d1f23",
    background="#f7f7f5",
    surface="#ffffff",
    panel="#e6e8ec",
    warning="#9a6d00",
    error="#c0262d",
    success="#2e7d32",
    # Tableau 10, darkened where it washes out on white.
    segments=(
        "#3a6491",
        "#3f8a36",
        "#d6741a",
        "#c8404a",
        "#3c8f89",
        "#b39200",
        "#8e5b83",
        "#d86f7d",
        "#7b5a45",
        "#8a817c",
        "#c9c9c9",
    ),
    observed="#c0262d",
    target="#1b7f24",
    roofline="#1f5fa8",
    running="#3c8f89",
    muted="#6b7077",
)

# Okabe & Ito (2008) "Color Universal Design" palette, distinguishable with every common colour-vision
# deficiency, extended with white and greys; on pure black for contrast. The bar also changes fill glyph per
# segment in this theme (see BudgetBar), so no information rests on hue alone.
CONTRAST = Palette(
    name="decodetop-contrast",
    dark=True,
    primary="#56b4e9",
    secondary="#009e73",
    accent="#e69f00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#1a1a1a",
    warning="#e69f00",
    error="#d55e00",
    success="#009e73",
    segments=(
        "#0072b2",
        "#009e73",
        "#e69f00",
        "#d55e00",
        "#56b4e9",
        "#f0e442",
        "#cc79a7",
        "#ffffff",
        "#999999",
        "#ddcc77",
        "#444444",
    ),
    observed="#d55e00",
    target="#f0e442",
    roofline="#56b4e9",
    running="#56b4e9",
    muted="#bbbbbb",
)

PALETTES: tuple[Palette, ...] = (DARK, LIGHT, CONTRAST)
"""Built-in themes in the order `t` cycles through them."""
