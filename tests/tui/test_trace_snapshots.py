"""SVG snapshots of the main screen with the traced bar under the probed one, at 80×24 and 160×48 (fixed clock,
the planted graph-mode trace, its file dated 3 minutes before the clock). Review the report before
`--snapshot-update`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from decodetop.tui.app import DecodetopApp
from decodetop.tui.trace_source import TraceOptions

from .conftest import wait_until
from .fakes import NOW_S
from .test_trace_bar import PLANTED, loaded, trace_app

SIZES = [(80, 24), (160, 48)]


def _runner(app: DecodetopApp, focus: bool) -> Callable[[Pilot[object]], object]:
    async def run_before(pilot: Pilot[object]) -> None:
        await wait_until(pilot, lambda: loaded(app)() and app.budget_settled and bool(app.checks), "the bars")
        if focus:
            app.query_one("#traced").focus()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_traced_bar(snap_compare: Callable[..., bool], size: tuple[int, int], tmp_path: Path) -> None:
    trace = tmp_path / PLANTED.name
    shutil.copy(PLANTED, trace)
    os.utime(trace, (NOW_S - 180, NOW_S - 180))
    app = trace_app(TraceOptions(path=trace))
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, focus=size[0] > 100))
