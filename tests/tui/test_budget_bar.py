"""The budget bar on its own: markers, the zoomed bar, the legend, over and under the observed step."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
from textual import events
from textual.app import App, ComposeResult
from textual.color import Color

from decodetop.budget.components import Component
from decodetop.themes import register_themes, theme_variable_defaults
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import BudgetMove, BudgetSegment, BudgetView
from decodetop.tui.widgets.budget_bar import (
    SHORT_LABELS,
    BudgetBar,
    LegendColumn,
    fit_label_widths,
    format_delta_ms,
    format_ms,
)


class _BarApp(App[None]):
    def __init__(self, view: BudgetView, theme: str = "decodetop-dark") -> None:
        super().__init__()
        self.view = view
        register_themes(self)
        self.theme = theme

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theme_variable_defaults()

    def compose(self) -> ComposeResult:
        yield BudgetBar()

    def on_mount(self) -> None:
        bar = self.query_one(BudgetBar)
        bar.now_s = 1000.0
        bar.budget = self.view


def _view(ms: dict[Component, float], observed: float = 95.0, roofline: float | None = 2.1) -> BudgetView:
    segments = tuple(
        BudgetSegment(
            c.value, c.label, ms.get(c, 0.0), "measured" if c in ms else "missing", 400.0 if c in ms else None
        )
        for c in Component
    )
    return BudgetView("GLM-5 · TP8", segments, observed, 1000 / 309, roofline)


async def _lines(view: BudgetView, width: int, theme: str = "decodetop-dark", compact: bool = False) -> list[str]:
    app = _BarApp(view, theme)
    async with app.run_test(size=(width, 30)) as pilot:
        bar = app.query_one(BudgetBar)
        bar.compact = compact
        await pilot.pause()
        return [line.plain for line in bar._lines(width)]


async def test_small_target_and_large_observed_both_read_at_80_columns() -> None:
    lines = await _lines(_view({Component.ATTENTION: 1.2, Component.COMMUNICATION: 6.55}), 78)
    text = "\n".join(lines)
    assert "observed 95.0ms" in lines[0] and "target 3.24ms" in lines[0]  # the one-line verdict, with units
    bars = [line for line in lines if line.lstrip().startswith("0–")]
    assert bars[0].lstrip().startswith("0–95.0ms")
    assert bars[1].rstrip().endswith("»")  # the zoomed bar runs on into the remainder
    assert "◆target 3.24ms" in text and "▲" in text and "◇" in text
    assert "no figure yet:" in text
    assert "unexplained 87.2ms" in text  # 95 − 7.75, three significant figures


async def test_legend_shows_ms_share_and_age() -> None:
    lines = await _lines(_view({Component.ATTENTION: 1.2}), 78)
    entry = next(line for line in lines if "attention" in line and "ms" in line)
    assert "1.20ms" in entry and "1.3%" in entry and "10m" in entry  # measured at 400 s, now 1000 s


async def test_parts_above_the_observed_step_are_called_out() -> None:
    lines = await _lines(_view({Component.ATTENTION: 120.0}), 78)
    assert "exceeds observed by 25.0ms" in lines[0]
    assert "over observed" in "\n".join(lines) and "unexplained" not in "\n".join(lines)  # never a clamped 0


async def test_compact_legend_fits_three_columns_and_contrast_theme_varies_glyphs() -> None:
    ms = {c: 0.5 + i for i, c in enumerate(Component)}
    lines = await _lines(_view(ms), 78, theme="decodetop-contrast", compact=True)
    legend = [line for line in lines if line[:1] in set("█▓▒▚▞▀▄▌▙▖░") and ("attention" in line or "routing" in line)]
    assert legend and all(len(line) <= 78 for line in lines)
    bar = next(line for line in lines if "0–" in line)
    assert {"█", "▓", "▒"} & set(bar)


def test_format_ms() -> None:
    assert [format_ms(v) for v in (0.0, 0.412, 3.236, 95.0, 112.4)] == ["0", "0.412", "3.24", "95.0", "112"]


async def test_estimated_and_interpolated_figures_are_marked() -> None:
    segments = (
        BudgetSegment("attention", "attention", 1.0, "estimated"),
        BudgetSegment("communication", "all-reduce", 2.0, "interpolated", 990.0),
    )
    lines = await _lines(BudgetView("m", segments, 95.0, 3.24, None), 78)
    assert any("attention" in line and "≈" in line for line in lines)
    assert any("all-reduce" in line and "~10s" in line for line in lines)


def test_format_delta_ms() -> None:
    full = [format_delta_ms(v) for v in (0.6, -0.0123, 12.34, -150.0)]
    assert full == ["Δ+0.600 ms", "Δ-0.0123 ms", "Δ+12.3 ms", "Δ-150 ms"]
    compact = [format_delta_ms(v, compact=True) for v in (0.6, -0.0123, 12.34, -150.0, 2400.0)]
    assert compact == ["Δ+0.60ms", "Δ-0.01ms", "Δ+12.3ms", "Δ-150ms", "Δ+2.40s"]  # the unit at every width
    assert max(len(t) for t in full) <= 11 and max(len(t) for t in compact) <= 8


async def test_moved_components_show_their_signed_change_in_the_theme_colours() -> None:
    ms = {Component.ATTENTION: 1.2, Component.ROUTED_EXPERTS: 2.1, Component.NORMS: 0.3}
    moved = (BudgetMove("attention", 0.6), BudgetMove("routed_experts", -0.5))
    view = dataclasses.replace(_view(ms), moved=moved)
    for compact, up, down in ((False, "Δ+0.600 ms", "Δ-0.500 ms"), (True, "Δ+0.60ms", "Δ-0.50ms")):
        app = _BarApp(view)
        async with app.run_test(size=(80, 30)) as pilot:
            bar = app.query_one(BudgetBar)
            bar.compact = compact
            await pilot.pause()
            parts = {seg.key: bar._legend_parts(view, seg) for seg in view.components if seg.status != "missing"}
            column = LegendColumn(
                16,
                max(p.value.cell_len for p in parts.values()),
                max(p.tail.cell_len for p in parts.values()),
                2,
            )
            entries = {key: bar._legend_entry(p, column) for key, p in parts.items()}
            variables = app.theme_variables
            assert up in entries["attention"].plain and down in entries["routed_experts"].plain
            assert "Δ" not in entries["norms"].plain and "%" in entries["norms"].plain
            assert {len(t.plain) for t in entries.values()} == {column.cells}  # the columns stay aligned
            for key, colour in (("attention", variables["state-bad"]), ("routed_experts", variables["state-ok"])):
                text = entries[key]
                start = text.plain.index("Δ")
                styles = [span.style for span in text.spans if span.start <= start < span.end]
                assert any(Color.parse(colour).rich_color == getattr(s, "color", None) for s in styles), styles


async def test_shares_of_thousands_of_percent_keep_the_legend_columns() -> None:
    """CPU ranks' parts can be thousands of times an assumed 95 ms step: the share column keeps its width."""
    view = _view({Component.ATTENTION: 20570.0, Component.NORMS: 0.5})
    for compact, width in ((False, 100), (True, 78)):
        lines = await _lines(view, width, compact=compact)
        shown = "20.6s >1k%" if compact else "20.6s >999%"
        assert any("attention" in line and shown in line for line in lines), lines
        assert "norms" in "\n".join(lines)


async def test_rank_spread_and_straggler_read_under_the_title() -> None:
    view = dataclasses.replace(
        _view({Component.ATTENTION: 1.2}),
        ranks_text="per rank (ms, medians): GPU 0 1.23 · GPU 1 3.41; spread 2.18 ms (177 %); step bound 3.41 ms",
        straggler="straggler: GPU 1 (+2.18 ms, +177% over the other ranks' median; likely: another process on GPU 1)",
    )
    lines = await _lines(view, 78)
    assert lines[2].startswith("per rank (ms, medians): GPU 0 1.23") and lines[2].endswith("…")
    assert lines[3].startswith("straggler: GPU 1 (+2.18 ms")
    assert "another process on GPU 1" in " ".join(lines[3:5])
    plain = await _lines(_view({Component.ATTENTION: 1.2}), 78)
    assert not any("per rank" in line or "straggler" in line for line in plain)


LEGEND_SIZES = [(80, 24), (120, 40), (200, 50)]
"""The terminals the legend is checked at: the compact legend (80×24), three columns (120), five (200)."""


def _long_labels_view() -> BudgetView:
    """Every component, the longest labels, figures from 0.5 ms to a CPU rank's 10640 ms (112× the step), and the
    projections a roofline estimate (≈, hatched)."""
    ms = {c: 0.5 + 3.1 * i for i, c in enumerate(Component)}
    ms[Component.ROUTED_EXPERTS] = 10640.0
    view = _view(ms)
    segments = tuple(
        dataclasses.replace(seg, status="estimated", measured_at_s=None) if seg.key == "attention_proj" else seg
        for seg in view.segments
    )
    return dataclasses.replace(view, segments=segments)


_ONE_FIGURE = re.compile(r"[~≈]?>?\d+(\.\d+)?(ms|µs|ns|k?%|[smhd])?↺?")
"""One figure of the legend: "0.500ms", "10.6s", "24.0µs", "13.6%", ">999%", ">1k%", "10m", "~10s"."""


def _legend_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line[:1] in {"█", "▓", "▒", "▚", "▞", "▀", "▄", "▌", "▙", "▖", "░"}]


@pytest.mark.parametrize("size", LEGEND_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_legend_labels_take_the_width_there_is(size: tuple[int, int]) -> None:
    """Each label is whole, or its short form, never cut with "…"; no line runs past the bar; numbers never touch."""
    width, rows = size
    lines = await _lines(_long_labels_view(), width - 2, compact=rows < 40)
    legend = _legend_lines(lines)
    text = "\n".join(legend)
    assert legend and "…" not in text and all(len(line) <= width - 2 for line in lines)
    for c in Component:
        assert c.label in text or SHORT_LABELS[c.value] in text, (c, legend)
    glued = [t for t in text.split() if any(ch.isdigit() for ch in t) and not _ONE_FIGURE.fullmatch(t)]
    assert not glued, legend  # "ms11200%" of "10640 ms11200%" would be one
    assert "10.6s" in text and (">999%" in text or ">1k%" in text)
    projections = next(line for line in legend for part in ("attention projections", "attn proj") if part in line)
    assert "≈" in projections and "Δ" not in text
    if width >= 200:  # five columns of whole labels
        assert all(c.label in text for c in Component), legend


def test_fit_label_widths_keeps_short_labels_whole_then_widens_toward_whole_labels() -> None:
    assert fit_label_widths([9, 10, 11], [21, 23, 22], 80) == [21, 23, 22]
    assert fit_label_widths([9, 10, 11], [9, 23, 22], 45) == [9, 14, 22]  # one whole column, not two cut ones
    assert fit_label_widths([9, 10, 11], [21, 23, 22], 32) == [10, 11, 11]  # short labels whole first
    assert fit_label_widths([9, 10, 11], [21, 23, 22], 27) == [9, 9, 9]
    assert fit_label_widths([5], [8], -3) == [0]


class _LegendApp(App[None]):
    """The bar at the top of a screen of the given size, as the live UI lays it out (compact below 40 rows)."""

    def __init__(self, view: BudgetView) -> None:
        super().__init__()
        self.view = view
        register_themes(self)
        self.theme = "decodetop-dark"

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theme_variable_defaults()

    def compose(self) -> ComposeResult:
        yield BudgetBar()

    def on_mount(self) -> None:
        bar = self.query_one(BudgetBar)
        bar.now_s = 1000.0
        bar.budget = self.view

    def on_resize(self, event: events.Resize) -> None:
        self.query_one(BudgetBar).compact = event.size.height < DecodetopApp.COMPACT_BELOW_ROWS


@pytest.mark.parametrize("size", LEGEND_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_legend_with_long_labels(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    assert snap_compare(_LegendApp(_long_labels_view()), terminal_size=size)


async def _legend_after(sizes: list[tuple[int, int]]) -> list[str]:
    """The bar's lines after the terminal passes through `sizes` (the legend read from the screen's last size)."""
    app = _LegendApp(_long_labels_view())
    async with app.run_test(size=sizes[0]) as pilot:
        for size in sizes[1:]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
        bar = app.query_one(BudgetBar)
        return [line.plain for line in bar._lines(bar.content_region.width)]


async def test_a_resized_legend_equals_a_fresh_one_at_the_final_size() -> None:
    """Widths come from the size each resize brings: 120 → 80 → 200 lays the legend out as a start at 200 does."""
    after = await _legend_after([(120, 40), (80, 24), (200, 50)])
    assert after == await _legend_after([(200, 50)])
    assert all(c.label in "\n".join(after) for c in Component)
    assert await _legend_after([(200, 50), (120, 40)]) == await _legend_after([(120, 40)])
