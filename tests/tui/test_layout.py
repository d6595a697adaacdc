"""Layout follows the terminal size: after any sequence of resizes the screen is laid out as a fresh start at the
final size would be, and below the minimum a "too small" notice replaces the layout until the terminal grows.

Pilot tests compare what is shown (each widget's region and the text on screen); SVG snapshots at 80×24, 120×40
and 200×50 show the result of a resize sequence and the notice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.tui.app import DecodetopApp
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import column_widths, sorted_checks

from .conftest import make_app, wait_until
from .fakes import FakeTelemetry, eight_gpu_frame, make_sources

SIZES = [(80, 24), (120, 40), (200, 50)]
SEQUENCES = {
    "120x40-40x12-200x50": [(120, 40), (40, 12), (200, 50)],
    "201x50-120x40": [(201, 50), (120, 40)],
    "200x50-80x24": [(200, 50), (80, 24)],
    "80x24-150x40-149x40-120x40": [(80, 24), (150, 40), (149, 40), (120, 40)],
}


def _app() -> DecodetopApp:
    return make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame()])))


def _ready(app: DecodetopApp) -> bool:
    return (
        app.query_one(BudgetBar).budget is not None
        and app.budget_settled
        and bool(app.checks)
        and app.query_one("#gpu-table", GpuTable).row_count == 8
    )


def _screen_text(app: DecodetopApp) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def _layout(app: DecodetopApp) -> tuple[object, ...]:
    """What the layout is: every widget with an id, where it is and whether it shows, the legend mode, the text."""
    placed = tuple(
        (w.id, w.display, tuple(w.region) if w.display else None)
        for w in app.screen.walk_children()
        if w.id is not None and not w.id.startswith("--")
    )
    return (placed, app.query_one(BudgetBar).compact, _screen_text(app))


async def _settle(pilot: Pilot[object], app: DecodetopApp) -> None:
    await wait_until(pilot, lambda: _ready(app), "app data")
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("steps", list(SEQUENCES.values()), ids=list(SEQUENCES))
async def test_any_resize_sequence_lays_out_like_a_fresh_start(steps: list[tuple[int, int]]) -> None:
    final = steps[-1]
    fresh = _app()
    async with fresh.run_test(size=final) as pilot:
        await _settle(pilot, fresh)
        expected = _layout(fresh)
    resized = _app()
    async with resized.run_test(size=steps[0]) as pilot:
        await _settle(pilot, resized)
        for width, height in steps[1:]:
            await pilot.resize_terminal(width, height)
            await pilot.pause()
        await _settle(pilot, resized)
        assert _layout(resized) == expected


async def test_the_side_panel_comes_back_after_a_small_terminal() -> None:
    app = _app()
    async with app.run_test(size=(200, 50)) as pilot:
        await _settle(pilot, app)
        assert app.query_one("#side").display
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not app.query_one("#side").display
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert app.query_one("#side").display
        assert not app.query_one(BudgetBar).compact


async def test_too_small_says_so_until_the_terminal_grows() -> None:
    app = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(pilot, app)
        assert "too small" not in _screen_text(app)
        await pilot.resize_terminal(40, 12)
        await pilot.pause()
        text = _screen_text(app)
        assert "terminal too small: 40×12" in text
        assert "decodetop check" in text
        assert not app.query_one("#main").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert "too small" not in _screen_text(app)
        assert app.query_one("#main").display


def _runner(app: DecodetopApp, steps: list[tuple[int, int]]) -> Callable[[Pilot[object]], object]:
    async def run_before(pilot: Pilot[object]) -> None:
        await _settle(pilot, app)
        for width, height in steps:
            await pilot.resize_terminal(width, height)
            await pilot.pause()
        await _settle(pilot, app)

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_after_passing_through_a_tiny_terminal(
    snap_compare: Callable[..., bool], size: tuple[int, int]
) -> None:
    """Start at another size, shrink below the minimum, end at `size`: the screen of a fresh start at `size`."""
    start = (200, 50) if size != (200, 50) else (80, 24)
    app = _app()
    assert snap_compare(app, terminal_size=start, run_before=_runner(app, [(40, 12), size]))


def test_snapshot_too_small(snap_compare: Callable[..., bool]) -> None:
    app = _app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=_runner(app, [(40, 12)]))


async def test_80x24_shows_all_8_gpus_with_memory_and_every_footer_key() -> None:
    app = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(pilot, app)
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#gpu-table", GpuTable)
        assert "mem" in [str(k.value) for k in table.columns]
        assert table.region.height >= 1 + 8  # the header and 8 rows, no scrollbar eating one
        text = _screen_text(app)
        assert all(f"\n {i}    " in text for i in range(8))
        footer = text.splitlines()[-1]
        assert "t theme" in footer and "p TP" in footer


def test_health_text_columns_take_the_width() -> None:
    narrow, wide = column_widths(80), column_widths(200)
    assert narrow["title"] >= 22 and narrow["observed"] >= 26
    assert sum(narrow.values()) + 2 * len(narrow) <= 80
    assert wide["title"] > 40 and wide["observed"] > 50
    assert sum(wide.values()) + 2 * len(wide) <= 200


def test_health_rows_put_info_after_pass() -> None:
    checks = tuple(
        CheckResult(cid, cid, status, "", "")
        for cid, status in (("I1", Status.INFO), ("P1", Status.PASS), ("F1", Status.FAIL), ("U1", Status.UNKNOWN))
    )
    checks += (CheckResult("W1", "W1", Status.WARN, "", ""),)
    assert [c.check_id for c in sorted_checks(checks)] == ["F1", "W1", "U1", "P1", "I1"]


def test_health_rows_sort_ids_naturally_in_the_order_check_prints() -> None:
    """C2 before C13 (not as text), a check's subjects in the order they came, and the very order of
    `decodetop check`."""
    from decodetop.collectors.checks.result import sort_for_display

    checks = tuple(
        CheckResult(cid, cid, status, "", "")
        for cid, status in (
            ("C13", Status.PASS),
            ("N12", Status.PASS),
            ("C2", Status.PASS),
            ("P1:0000:3b:00.0", Status.PASS),
            ("P1:0000:04:00.0", Status.PASS),
            ("C1", Status.PASS),
            ("N1", Status.PASS),
            ("N1-N11", Status.INFO),
            ("C16", Status.INFO),
        )
    )
    order = [c.check_id for c in sorted_checks(checks)]
    assert order == ["C1", "C2", "C13", "N1", "N12", "P1:0000:3b:00.0", "P1:0000:04:00.0", "C16", "N1-N11"]
    assert order == [c.check_id for c in sort_for_display(list(checks))]
