"""Property tests (hypothesis) over every view the live UI builds from outside text: the telemetry frame (GPU names,
users, command lines, a replay's source), checks (host files or a recording), probe results (the history or a
replay), a trace's kernel table, the budget details with the history's fingerprints, the consent modal and the
status line. Whatever the text (arbitrary, controls, Rich markup, mixes), each comes out as `Text` with every
control marked and its markup as typed: nothing is parsed, no ESC byte is left. `tests/tui/test_hostile_ui.py`
drives the same text through the running app."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from rich.text import Text

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.history import Fingerprint
from decodetop.inert import inert, inert_data
from decodetop.pipeline.gpu_guard import HeldGpus
from decodetop.probes.gpuinfo import GpuProcess
from decodetop.probes.results import load_results
from decodetop.traces.trace_report import KernelStat
from decodetop.traces.traced import TracedSegment
from decodetop.tui.other_scenarios import OtherScenario
from decodetop.tui.screens.budget_details import BudgetDetails, budget_details_text
from decodetop.tui.screens.confirm_probes import confirm_text
from decodetop.tui.screens.details import check_detail_text, probe_detail_text
from decodetop.tui.screens.gpu_details import gpu_detail_text
from decodetop.tui.screens.trace_kernels import kernel_rows
from decodetop.tui.sources.checks import RecordedChecks
from decodetop.tui.sources.probe_views import probe_view
from decodetop.tui.sources.telemetry_views import telemetry_frame
from decodetop.tui.widgets.status_line import StatusLine
from tests.helpers.hostile_text import assert_inert, hostile_text

from .test_hostile_ui import H200_RESULTS

EXAMPLES = settings(max_examples=60, deadline=None)


def _shown(text: Text, value: str) -> None:
    """`text` holds no control, and `value` as its inert form: markup as typed, not parsed away."""
    assert_inert(text.plain)
    assert inert(value) in text.plain


@EXAMPLES
@given(text=hostile_text)
def test_a_telemetry_frame_is_inert_and_its_gpu_details_too(text: str) -> None:
    backend = FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=1, clock=None)
    snap = TelemetrySampler(Nvml(backend)).sample(processes=False)
    snap = dataclasses.replace(snap, source=text, gpus=[dataclasses.replace(g, name=text) for g in snap.gpus])
    frame = telemetry_frame(snap, describe=lambda pid: (text, text))
    assert_inert(frame.source_note)
    assert frame.source_note == inert(f"data from {text}")
    gpu = frame.gpus[0]
    assert gpu.name == inert(text)
    _shown(gpu_detail_text(gpu, [gpu]), text)


@EXAMPLES
@given(text=hostile_text)
def test_checks_from_a_recording_are_inert_and_their_details_too(text: str) -> None:
    check = CheckResult("C1", text, Status.WARN, text, text, text, text, subject=text, facts={text: text})
    (shown,) = RecordedChecks([check]).run()
    for value in (shown.title, shown.observed, shown.expected, shown.why, shown.fix, shown.subject):
        assert value == inert(text)
    assert shown.facts == {inert(text): inert(text)}
    _shown(check_detail_text(shown, changed=False), text)


@EXAMPLES
@given(text=hostile_text)
def test_a_probe_result_from_the_history_or_a_replay_is_inert_in_its_view(text: str) -> None:
    result = load_results(H200_RESULTS)[0]
    env = result.environment
    assert env is not None
    hostile = dataclasses.replace(
        result, environment=dataclasses.replace(env, gpu_names=(text,)), error=text, traceback=text, rank_log=text
    )
    view = probe_view(hostile, title=text)
    assert view.title == inert(text) and view.traceback == inert(text)
    detail = probe_detail_text(view, 0.0)
    assert_inert(detail.plain)
    assert inert(text) in detail.plain


@EXAMPLES
@given(name=hostile_text, via=hostile_text)
def test_the_kernel_table_cells_are_text_never_markup(name: str, via: str) -> None:
    kernel = KernelStat(name, "attention", None, None, via, count_per_step=1.0, time_us_per_step=2.0, mean_us=2.0,
                        share=0.5)  # fmt: skip
    segment = inert_data(TracedSegment("attention", "attention", 1.0, None, 1.0, (kernel,)))  # as the bar makes it
    (row,) = kernel_rows(segment, name_width=10_000)
    assert all(isinstance(cell, Text) and not cell.spans for cell in row)
    assert row[0].plain == inert(name) and row[5].plain == (inert(via) or "-")
    for cell in row:
        assert_inert(cell.plain)


@EXAMPLES
@given(text=hostile_text)
def test_budget_details_show_the_historys_fingerprints_inert(text: str) -> None:
    fingerprint = Fingerprint(text, "cuda", text, 2, text, text, text, text, text, f"model=preset:{text};tp=2")
    other = OtherScenario(fingerprint, records=3, newest_at_s=0.0)
    details = BudgetDetails(view=None, held_line=text, stored_line=text, others=(other,))
    body = budget_details_text(details, now_s=60.0)
    assert_inert(body.plain)
    assert inert(text) in body.plain


@EXAMPLES
@given(text=hostile_text)
def test_the_consent_modal_names_the_processes_inert(text: str) -> None:
    held = HeldGpus(gpus=(0,), processes=(GpuProcess(0, 4242, text, 1 << 30),))  # a process name: any user picks it
    _shown(confirm_text(held, probes=2), text)


@EXAMPLES
@given(text=hostile_text)
def test_the_status_line_renders_inert(text: str) -> None:
    line = StatusLine()
    line.text = text
    _shown(line.render(), text)
