"""The GPUs tab as nvitop and btop users expect it: a process list (pid, user, GPU memory, SM share, command) from
NVML's running processes, per-GPU history (sparklines in the table, plots in the Charts tab), sort (`o`, a header
click) and `/` filter, enter on a GPU for its details, a TP picker (`p`), and columns that follow the width.

Pilot tests assert on the widgets; SVG snapshots at 80×24, 120×40 and 200×50 show the screens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.tui.app import DecodetopApp
from decodetop.tui.messages import TelemetryReady
from decodetop.tui.screens.gpu_details import GpuDetailScreen, gpu_detail_text
from decodetop.tui.screens.tp_picker import TpPickerScreen, tp_options
from decodetop.tui.sources.telemetry_views import ProcessInfo, telemetry_frame
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable, fit_columns, sparkline
from decodetop.tui.widgets.probe_table import ProbeTable, column_widths
from decodetop.tui.widgets.process_table import ProcessTable, process_rows

from .conftest import make_app, steady_cursors, wait_until
from .fakes import FakeTelemetry, eight_gpu_frame, make_sources

SIZES = [(80, 24), (120, 40), (200, 50)]
UTIL_HISTORY = (0.0, 10.0, 40.0, 90.0, 100.0, 60.0, 20.0)
TICK_S = 90.0
"""The history's ticks are 90 s apart: seven span nine minutes of the ten the sparklines show."""


def _history_frames() -> list[object]:
    """GPU 0's utilisation over seven ticks, the last one with the processes."""
    n = len(UTIL_HISTORY)
    frames = [eight_gpu_frame(1_800_000_000.0 - TICK_S * (n - 1 - i), util=u) for i, u in enumerate(UTIL_HISTORY)]
    last = eight_gpu_frame(processes=True, util=UTIL_HISTORY[-1])
    return [*frames[:-1], last]


def _app() -> DecodetopApp:
    return make_app(make_sources(telemetry=FakeTelemetry(_history_frames()[:1])))  # type: ignore[arg-type]


def _ready(app: DecodetopApp) -> bool:
    return (
        app.query_one(BudgetBar).budget is not None
        and app.budget_settled
        and bool(app.checks)
        and app.query_one("#gpu-table", GpuTable).row_count == 8
        and app.query_one(ProcessTable).frame is not None
    )


async def _settle(pilot: Pilot[object], app: DecodetopApp) -> None:
    """Wait for the first frame, then feed the rest one tick at a time (a newer TelemetryReady replaces a queued
    one, as it should for a live UI, so a burst would keep only the last)."""
    await wait_until(pilot, lambda: app.last_frame is not None, "first frame")
    for frame in _history_frames()[1:]:
        app.post_message(TelemetryReady(frame))  # type: ignore[arg-type]
        await wait_until(pilot, lambda frame=frame: app.last_frame is frame, "the tick shown")
    await wait_until(pilot, lambda: _ready(app), "GPU data")
    await pilot.pause()


# --- pure parts --------------------------------------------------------------------------------------------------


def test_columns_follow_the_width_and_keep_memory_and_clock_events_at_80() -> None:
    narrow = [c.key for c in fit_columns(80)]
    assert {"gpu", "util", "mem", "sm", "temp", "power", "reasons"} <= set(narrow)
    assert sum(c.width + 2 for c in fit_columns(80)) <= 78  # no horizontal scrollbar at 80 columns
    wide = [c.key for c in fit_columns(200)]
    assert {"name", "bus", "util_hist", "memutil", "ecc", "nvlink", "power_hist", "temp_hist"} <= set(wide)
    reasons = next(c for c in fit_columns(200) if c.key == "reasons")
    assert reasons.width >= len("HwThermalSlowdown")


def test_probe_values_take_the_room_there_is() -> None:
    assert column_widths(80, len("allreduce"))["value"] == 38  # 80 - 9 - 17 - 6 - 4 × 2 padding - 2 scrollbar
    assert column_widths(200, len("GEMM at decode shapes"))["value"] > 100
    assert column_widths(60, 22)["value"] == 12  # never narrower: the age column stays in view


def test_sparkline_scales_to_its_top() -> None:
    assert sparkline([0.0, 50.0, 100.0, 150.0], 100.0) == "▁▅██"
    assert sparkline([1.0], 0.0) == ""


def test_fake_nvml_processes_and_distinct_bus_ids_reach_the_frame() -> None:
    """The H200 recording has a process on each GPU; replicated to 8, every GPU has its own bus id and UUID."""
    nvml = Nvml(FakeNvmlBackend(load_recording("h200x2-load"), replicate_to=8))
    snapshot = TelemetrySampler(nvml).sample(processes=True)
    frame = telemetry_frame(snapshot)
    assert len({g.bus_id for g in frame.gpus}) == 8
    assert len({g.uuid for g in snapshot.gpus}) == 8
    procs = [p for g in frame.gpus for p in g.processes or ()]
    assert procs and all(p.used_mem_bytes for p in procs)
    # a recording's pids belong to another host: never looked up here
    assert {p.command for p in procs} == {"(recorded on another host)"}
    live = telemetry_frame(
        dataclasses.replace(snapshot, source="nvml"), lambda pid: ProcessInfo("alice", f"python serve.py {pid}")
    )
    first = live.gpus[0].processes
    assert first is not None and first[0].user == "alice" and first[0].command.startswith("python serve.py")


def test_process_rows_largest_memory_first_and_filtered() -> None:
    frame = eight_gpu_frame(processes=True)
    rows = process_rows(frame)
    assert [p.pid for _, p in rows] == [4242, 4243, 5150, 5151]
    assert [p.user for _, p in process_rows(frame, "alice")] == ["alice"]  # the process matches, as nvitop filters
    assert [p.user for _, p in process_rows(frame, "02:06")] == ["alice", "bob"]  # GPU 2's bus: all its processes


def test_gpu_detail_text_has_clocks_throttle_history_pcie_nvlink_and_processes() -> None:
    frames = _history_frames()
    history = [f.gpus[0] for f in frames]  # type: ignore[attr-defined]
    text = gpu_detail_text(history[-1], history).plain
    assert "SM       345 / 1980 MHz (17 %)" in text
    assert "clock events over the last 7 ticks" in text and "ticks -6…0     GpuIdle" in text
    assert "Gen5 x16 (max Gen5 x16)" in text
    assert "NVLink   18 of 18 active" in text
    assert "4242" in text and "vllm" in text and "SM  71%" in text


def test_tp_options_offer_auto_the_usual_degrees_and_mark_too_many() -> None:
    options = dict(tp_options(4, None))
    assert "auto" in options and "4 GPUs here" in options["auto"]
    assert options["8"].endswith("more than the 4 GPUs here")
    assert "3" in dict(tp_options(3, None))


# --- Pilot -------------------------------------------------------------------------------------------------------


async def test_process_list_and_sparklines_on_the_gpus_tab() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        await pilot.press("2")
        procs = app.query_one(ProcessTable)
        assert procs.display
        assert [str(k.value) for k in procs.rows] == ["pid-0-4242", "pid-1-4243", "pid-2-5150", "pid-2-5151"]
        assert str(procs.get_cell("pid-2-5150", "user")) == "alice"
        assert str(procs.get_cell("pid-0-4242", "sm")) == "71%"
        assert str(procs.get_cell("pid-2-5151", "sm")) == "–"  # no SM figure from NVML: said, not invented
        table = app.query_one("#gpu-table", GpuTable)
        # nine slices of 67 s over the last ten minutes: a space where no tick fell, 0 % ▁ … 100 % █
        assert str(table.get_cell("gpu-0", "util_hist")) == "▁ ▂▄▇ █▅▂"
        assert str(table.get_cell("gpu-0", "util_bar")) == "█    "  # 20 % of five cells
        assert str(table.get_cell("gpu-0", "bus")) == "00:06.0"
        assert str(table.get_cell("gpu-7", "bus")) == "07:06.0"


async def test_sort_by_utilisation_then_filter_then_clear() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        await pilot.press("2")
        table = app.query_one("#gpu-table", GpuTable)
        await pilot.press("o")  # gpu → util
        assert table.sort_key == "util"
        order = [str(k.value) for k in table.rows]
        assert order[:4] == ["gpu-3", "gpu-1", "gpu-2", "gpu-0"]  # 95 %, the two at 70 %, GPU 0 at 20 %
        await pilot.press("slash")
        await pilot.press(*"alice")
        await pilot.pause()
        assert [str(k.value) for k in table.rows] == ["gpu-2"]
        assert [str(k.value) for k in app.query_one(ProcessTable).rows] == ["pid-2-5150"]  # alice's alone
        assert app.query_one(ProbeTable).row_count == 0  # no probe mentions alice
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 8
        assert app.query_one(ProbeTable).row_count == 3
        assert not app.query_one("#filter").display


async def test_header_click_sorts() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        await pilot.press("2")
        table = app.query_one("#gpu-table", GpuTable)
        table.post_message(
            GpuTable.HeaderSelected(
                table, table.columns[next(k for k in table.columns if k.value == "temp")].key, 0, "°C"
            )  # type: ignore[arg-type]
        )
        await pilot.pause()
        assert table.sort_key == "temp"
        assert str(next(iter(table.rows)).value) == "gpu-5"  # 88 °C


async def test_enter_on_a_gpu_opens_its_details() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        await pilot.press("2")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, GpuDetailScreen), "GPU details")
        screen = app.screen
        assert isinstance(screen, GpuDetailScreen)
        assert screen.gpu.index == 0 and len(screen.history) == len(UTIL_HISTORY)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, GpuDetailScreen), "closed")


async def test_tp_picker_changes_the_degree_and_the_plan() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        assert app.settings.tp == 8
        await pilot.press("p")
        await wait_until(pilot, lambda: isinstance(app.screen, TpPickerScreen), "TP picker")
        await pilot.press("up")  # from TP 8: TP 4
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.settings.tp == 4, "TP 4")
        await wait_until(pilot, lambda: "tp 4" in app._status_text, "status says TP 4")
        await pilot.press("p")
        await wait_until(pilot, lambda: isinstance(app.screen, TpPickerScreen), "TP picker again")
        await pilot.press("escape")  # cancel keeps it
        await pilot.pause()
        assert app.settings.tp == 4


async def test_charts_plot_every_gpu_history() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot, app)
        await pilot.press("4")
        await wait_until(pilot, lambda: app.charts is not None, "charts")
        for name in ("util", "mem", "power", "temp"):
            assert app.query_one(f"#chart-{name}")
        assert [v for _, v in app.telemetry.series["util"][0]] == list(UTIL_HISTORY)


# --- snapshots ---------------------------------------------------------------------------------------------------


def _runner(app: DecodetopApp, *keys: str) -> Callable[[Pilot[object]], object]:
    async def run_before(pilot: Pilot[object]) -> None:
        await _settle(pilot, app)
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        await steady_cursors(pilot)

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_gpus_with_processes_and_history(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    """80×24: the 8 GPUs fill the pane (the process list gives way); from 40 rows on the process list shows."""
    app = _app()
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "2"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_gpu_details(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = _app()
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "2", "enter"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_sorted_and_filtered(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = _app()
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "2", "o", "slash", "v", "l", "l", "m"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_tp_picker(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = _app()
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "p"))
