"""Provides the built-in Textual themes (dark, light, high-contrast colour-blind safe) and their registration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.theme import Theme

from decodetop.themes.palette import (
    PALETTES,
    SEGMENT_KEYS,
    SEGMENT_PATTERNS,
    Palette,
    segment_pattern,
    segment_variable,
)

if TYPE_CHECKING:
    from textual.app import App

__all__ = [
    "BUILTIN_THEMES",
    "DEFAULT_THEME",
    "SEGMENT_KEYS",
    "SEGMENT_PATTERNS",
    "THEME_NAMES",
    "drop_other_themes",
    "next_theme",
    "register_themes",
    "segment_pattern",
    "segment_variable",
    "theme_variable_defaults",
]


def _to_theme(palette: Palette) -> Theme:
    return Theme(
        name=palette.name,
        primary=palette.primary,
        secondary=palette.secondary,
        accent=palette.accent,
        foreground=palette.foreground,
        background=palette.background,
        surface=palette.surface,
        panel=palette.panel,
        warning=palette.warning,
        error=palette.error,
        success=palette.success,
        dark=palette.dark,
        variables=palette.variables(),
    )


BUILTIN_THEMES: dict[str, Theme] = {palette.name: _to_theme(palette) for palette in PALETTES}
"""Every built-in theme by name."""
THEME_NAMES: tuple[str, ...] = tuple(BUILTIN_THEMES)
"""Names in cycling order."""
DEFAULT_THEME = THEME_NAMES[0]


def register_themes(app: App[Any]) -> None:
    """Register every built-in theme with `app`."""
    for theme in BUILTIN_THEMES.values():
        app.register_theme(theme)


def drop_other_themes(app: App[Any]) -> None:
    """Unregister Textual's own themes, so the command palette offers only decodetop's (the budget bar, the markers
    and the statuses take their colours from decodetop's variables, which Textual's themes lack). Call it once
    `app.theme` is one of decodetop's."""
    for name in list(app.available_themes):
        if name not in BUILTIN_THEMES:
            app.unregister_theme(name)


def theme_variable_defaults() -> dict[str, str]:
    """Values of decodetop's variables when a theme without them (a Textual built-in) is active."""
    return PALETTES[0].variables()


def next_theme(current: str) -> str:
    """The theme after `current` in cycling order (the first one if `current` is not a built-in)."""
    if current not in THEME_NAMES:
        return THEME_NAMES[0]
    return THEME_NAMES[(THEME_NAMES.index(current) + 1) % len(THEME_NAMES)]
