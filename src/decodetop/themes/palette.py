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

SEGMENT_PATTERNS: dict[str, str] = {
    "attention": "█",
    "attention_proj": "▓",
    "dense_mlp": "▒",
    "routed_experts": "▚",
    "shared_experts": "▞",
    "routing": "▀",
    "communication": "▄",
    "norms": "▌",
    "lm_head": "▙",
    "launch": "▖",
    UNEXPLAINED_KEY: "░",
}
"""One fill glyph per segment, all different (Unicode Block Elements, U+2580–U+259F, single-width in every
monospace font), so segments stay apart without colour: with NO_COLOR, in the high-contrast theme, and for readers
who cannot tell two hues apart (WCAG 2.2 SC 1.4.1, https://www.w3.org/TR/WCAG22/#use-of-color)."""

TEXT_CONTRAST_MIN = 4.5
"""WCAG 2.2 SC 1.4.3 (AA) minimum contrast of text against its background (https://www.w3.org/TR/WCAG22/#contrast-minimum)."""
GRAPHIC_CONTRAST_MIN = 3.0
"""WCAG 2.2 SC 1.4.11 minimum contrast of adjacent graphical parts (https://www.w3.org/TR/WCAG22/#non-text-contrast)."""


def segment_pattern(key: str) -> str:
    """The fill glyph of a budget segment ("█" for a key this table does not know)."""
    return SEGMENT_PATTERNS.get(key, "█")


def relative_luminance(colour: str) -> float:
    """WCAG relative luminance of "#rrggbb" (https://www.w3.org/TR/WCAG22/#dfn-relative-luminance)."""
    hexa = colour.removeprefix("#")
    if len(hexa) != 6:
        raise ValueError(f"colour {colour!r} is not #rrggbb")
    channels = [int(hexa[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    # the sRGB transfer function and its constants as the WCAG definition gives them
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours, 1 to 21 (https://www.w3.org/TR/WCAG22/#dfn-contrast-ratio)."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


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

    def text_colours(self) -> dict[str, str]:
        """Every colour decodetop draws text or legend glyphs in, by role."""
        out = {
            "foreground": self.foreground,
            "primary": self.primary,
            "secondary": self.secondary,
            "accent": self.accent,
            "warning": self.warning,
            "error": self.error,
            "success": self.success,
            "mark-observed": self.observed,
            "mark-target": self.target,
            "mark-roofline": self.roofline,
            "state-running": self.running,
            "state-muted": self.muted,
        }
        out.update({segment_variable(key): colour for key, colour in zip(SEGMENT_KEYS, self.segments, strict=True)})
        return out

    def backgrounds(self) -> dict[str, str]:
        """Every colour text is drawn on: the screen, tables and panels (tab strip, footer)."""
        return {"background": self.background, "surface": self.surface, "panel": self.panel}

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
    primary="#7195bc",
    secondary="#76b7b2",
    accent="#f28e2b",
    foreground="#e0e0e0",
    background="#121417",
    surface="#1b1e23",
    panel="#252a31",
    warning="#edc948",
    error="#ff5f5f",
    success="#59a14f",
    # Tableau 10, lightened where it falls below 4.5:1 on the panel colour; the remainder a light grey (4.5:1).
    segments=(
        "#7195bc",
        "#59a14f",
        "#f28e2b",
        "#e56d6e",
        "#76b7b2",
        "#edc948",
        "#b582a7",
        "#ff9da7",
        "#ac8b77",
        "#bab0ac",
        "#929292",
    ),
    observed="#ff5f5f",
    target="#59e05f",
    roofline="#6fb8ff",
    running="#76b7b2",
    muted="#8d929a",
)

LIGHT = Palette(
    name="decodetop-light",
    dark=False,
    primary="#2f5d8c",
    secondary="#30716d",
    accent="#a64e00",
    foreground="#1d1f23",
    background="#f7f7f5",
    surface="#ffffff",
    panel="#e6e8ec",
    warning="#886000",
    error="#c0262d",
    success="#2b742e",
    # Tableau 10, darkened until each reaches 4.5:1 on the panel colour; the remainder a mid grey (4.5:1).
    segments=(
        "#3a6491",
        "#35742d",
        "#9b5413",
        "#bb3640",
        "#2f706c",
        "#7b6400",
        "#88577d",
        "#a8327a",
        "#7b5a45",
        "#6d6561",
        "#676767",
    ),
    observed="#c0262d",
    target="#197722",
    roofline="#1f5fa8",
    running="#2f706c",
    muted="#63676e",
)

# Okabe & Ito (2008) "Color Universal Design" palette, distinguishable with every common colour-vision
# deficiency, extended with white and greys (its blue lightened to reach 4.5:1 on the panel); on pure black.
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
        "#008ad8",
        "#009e73",
        "#e69f00",
        "#d55e00",
        "#56b4e9",
        "#f0e442",
        "#cc79a7",
        "#ffffff",
        "#999999",
        "#ddcc77",
        "#848484",
    ),
    observed="#d55e00",
    target="#f0e442",
    roofline="#56b4e9",
    running="#56b4e9",
    muted="#bbbbbb",
)

PALETTES: tuple[Palette, ...] = (DARK, LIGHT, CONTRAST)
"""Built-in themes in the order `t` cycles through them."""
