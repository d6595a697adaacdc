"""The main screen at every size from the 60×16 minimum to 200×50, with a trace loaded and without: SVG snapshots
of a whole probe plan (fixed clock), each checked before it is taken for what must stay on screen — the one-line
verdict with its units, the bar, at least three rows of the focused table — and, in the snapshots themselves,
every figure of the budget box carrying its unit. Review the report before `--snapshot-update`."""

from __future__ import annotations

import html
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from decodetop.tui.app import DecodetopApp
from decodetop.tui.trace_source import TraceOptions

from .conftest import make_app, wait_until
from .fakes import NOW_S, FakeTelemetry, eight_gpu_frame, make_sources
from .screens import PlanProbes, bare_numbers, box_lines, ready, rows_shown, screen_text
from .test_trace_bar import PLANTED, SETTINGS, loaded, small_budget

SIZES = [(60, 16), (80, 24), (100, 30), (120, 40), (200, 50)]
SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_screen_sizes"


def _app(trace: Path | None) -> DecodetopApp:
    telemetry = FakeTelemetry([eight_gpu_frame(processes=True)])
    if trace is None:
        return make_app(make_sources(probes=PlanProbes(), run_probes=True, telemetry=telemetry))
    sources = make_sources(probes=PlanProbes(), run_probes=True, telemetry=telemetry, budget=small_budget())
    sources.trace = TraceOptions(path=trace)
    return make_app(sources, SETTINGS)


def _planted(tmp_path: Path) -> Path:
    trace = tmp_path / PLANTED.name
    shutil.copy(PLANTED, trace)
    os.utime(trace, (NOW_S - 180, NOW_S - 180))
    return trace


def _what_must_show(app: DecodetopApp, traced: bool) -> Callable[[Pilot[object]], object]:
    async def run_before(pilot: Pilot[object]) -> None:
        await wait_until(pilot, lambda: ready(app) and (not traced or loaded(app)()), "the plan and the bars")
        await pilot.pause(0.1)
        text = screen_text(app)
        box = box_lines(text)
        verdict = [line for line in box if "explained" in line and "observed" in line and "target" in line]
        assert verdict, text  # the one-line verdict, first
        assert re.search(r"explained [\d.]+ ?(ms|µs|s) ", verdict[0]), verdict[0]
        assert any(line.lstrip().startswith("0–") and "░" in line for line in box), text  # the bar
        assert rows_shown(app) >= 3, text  # the focused table's rows
        if traced:
            assert any("traced" in line for line in box), text
        assert not [n for line in box for n in bare_numbers(line)], box

    return run_before


@pytest.mark.parametrize("traced", [False, True], ids=["no-trace", "trace"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare: Callable[..., bool], size: tuple[int, int], traced: bool, tmp_path: Path) -> None:
    app = _app(_planted(tmp_path) if traced else None)
    assert snap_compare(app, terminal_size=size, run_before=_what_must_show(app, traced))


def _svg_rows(svg: str) -> list[str]:
    """The text rows of a Textual SVG screenshot (cells placed by their x position)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        text = html.unescape(re.sub("<[^>]+>", "", m.group(3))).replace("\xa0", " ")
        rows.setdefault(float(m.group(2)), []).append((float(m.group(1)), text))
    out = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / 12.2)) + text
        out.append(line.rstrip())
    return out


def test_every_figure_in_the_snapshots_budget_box_has_its_unit() -> None:
    shots = sorted(SNAPSHOTS.glob("test_main_screen*.svg"))
    assert len(shots) == 2 * len(SIZES), [s.name for s in shots]
    for shot in shots:
        box = box_lines("\n".join(_svg_rows(shot.read_text())))
        assert len(box) >= 2, shot.name
        bare = [n for line in box for n in bare_numbers(line)]
        assert not bare, (shot.name, bare, box)
