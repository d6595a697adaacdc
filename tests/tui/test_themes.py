"""Every theme is legible: all text at least 4.5:1 against every background it is drawn on (WCAG AA), the budget
bar's segments apart by 3:1 or by their fill pattern; the command palette offers only decodetop's themes; with
NO_COLOR the bar's segments differ by pattern (an SVG snapshot shows it)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from decodetop.budget.components import UNEXPLAINED_KEY
from decodetop.themes import BUILTIN_THEMES, THEME_NAMES
from decodetop.themes.palette import (
    GRAPHIC_CONTRAST_MIN,
    PALETTES,
    SEGMENT_KEYS,
    SEGMENT_PATTERNS,
    TEXT_CONTRAST_MIN,
    Palette,
    contrast_ratio,
    segment_pattern,
)
from decodetop.tui.widgets.budget_bar import BudgetBar

from .conftest import make_app, wait_until
from .fakes import FakeTelemetry, eight_gpu_frame, make_sources


def test_wcag_contrast_ratio_matches_the_definition() -> None:
    assert contrast_ratio("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast_ratio("#777777", "#777777") == pytest.approx(1.0)
    # WebAIM's checker gives 4.48:1 for #777777 on white (https://webaim.org/resources/contrastchecker/)
    assert contrast_ratio("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    with pytest.raises(ValueError, match="not #rrggbb"):
        contrast_ratio("grey", "#ffffff")


@pytest.mark.parametrize("palette", PALETTES, ids=lambda p: p.name)
def test_all_text_reaches_4_5_to_1_on_every_background(palette: Palette) -> None:
    low = [
        f"{role} {colour} on {where} {bg}: {contrast_ratio(colour, bg):.2f}:1"
        for role, colour in palette.text_colours().items()
        for where, bg in palette.backgrounds().items()
        if contrast_ratio(colour, bg) < TEXT_CONTRAST_MIN
    ]
    assert not low, "\n".join(low)


@pytest.mark.parametrize("palette", PALETTES, ids=lambda p: p.name)
def test_the_unexplained_remainder_is_legible(palette: Palette) -> None:
    """The remainder is the most important number: its colour is text, not a dim filler."""
    colour = palette.variables()["seg-unexplained"]
    assert min(contrast_ratio(colour, bg) for bg in palette.backgrounds().values()) >= TEXT_CONTRAST_MIN


@pytest.mark.parametrize("palette", PALETTES, ids=lambda p: p.name)
def test_any_two_segments_differ_by_3_to_1_or_by_pattern(palette: Palette) -> None:
    """Any two segments can meet in the bar (components without a figure are skipped)."""
    colours = dict(zip(SEGMENT_KEYS, palette.segments, strict=True))
    same = [
        (a, b)
        for a, b in itertools.combinations(SEGMENT_KEYS, 2)
        if contrast_ratio(colours[a], colours[b]) < GRAPHIC_CONTRAST_MIN and segment_pattern(a) == segment_pattern(b)
    ]
    assert not same


def test_every_segment_has_its_own_pattern() -> None:
    assert set(SEGMENT_PATTERNS) == set(SEGMENT_KEYS)
    assert len(set(SEGMENT_PATTERNS.values())) == len(SEGMENT_KEYS)
    assert all(len(glyph) == 1 for glyph in SEGMENT_PATTERNS.values())
    assert segment_pattern(UNEXPLAINED_KEY) == "░"


async def test_the_command_palette_offers_only_decodetop_themes() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)):
        assert set(app.available_themes) == set(BUILTIN_THEMES)
        names = {c.title for c in app.get_system_commands(app.screen)}
        assert {f"Theme {name}" for name in THEME_NAMES} <= names  # decodetop's three, one entry each
        assert "Theme" not in names and "Keys" not in names  # none of Textual's stock entries
        assert {"Fold the budget box (f)", "Maximise the tab (z)", "Keys (?)", "Quit (q)"} <= names
    assert THEME_NAMES[0] == app.theme


def test_no_color_segments_differ_by_pattern(
    snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame()])))
    assert app.no_color

    async def run_before(pilot: object) -> None:
        await wait_until(pilot, lambda: app.query_one(BudgetBar).budget is not None and app.budget_settled, "budget")  # type: ignore[arg-type]
        bar = "\n".join(app.query_one(BudgetBar).render().plain.splitlines()[:6])
        shown = {SEGMENT_PATTERNS[k] for k in ("attention", "attention_proj", "routed_experts", UNEXPLAINED_KEY)}
        assert shown <= set(bar)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
