"""Provides the detail modals: ProbeDetailScreen (per-rank values, spread, telemetry during the run, error and
traceback), CheckDetailScreen (observed, expected, why and how to fix) and CheckGroupDetailScreen (a collapsed row of
the health table: every subject of one check and status, then why and how to fix once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from decodetop.collectors.checks.result import CheckResult
from decodetop.tui.model import ProbeView
from decodetop.tui.widgets.cells import ago
from decodetop.tui.widgets.probe_table import state_text

_CSS = """
{name} {{ align: center middle; }}
{name} > VerticalScroll {{ width: 90%; max-width: 120; height: auto; max-height: 90%;
    border: round $primary; background: $surface; padding: 0 1; }}
{name} .detail-error {{ color: $state-bad; }}
"""


def probe_detail_text(view: ProbeView, now_s: float) -> Text:
    """The body of the probe detail screen (pure, for tests)."""
    text = Text()
    text.append(f"{view.title or view.probe_id}\n", style="bold")
    text.append(f"state: {state_text(view)}")
    if view.progress_note:
        text.append(f" ({view.progress_note})")
    text.append("\n")
    if view.value_text:
        text.append(f"value: {view.value_text}\n")
    if view.measured_at_s is not None:
        origin = " (from an earlier session)" if view.from_history else ""
        text.append(f"measured: {ago(now_s - view.measured_at_s)}{origin}\n")
    if view.spread_text:
        text.append(f"spread: {view.spread_text}\n")
    if view.ranks:
        text.append("\nper rank:\n", style="bold")
        for rank in view.ranks:
            device = f" ({rank.device})" if rank.device else ""
            text.append(f"  rank {rank.rank}{device}: {rank.value_text}\n")
    if view.telemetry_text:
        text.append("\ntelemetry during the run:\n", style="bold")
        for line in view.telemetry_text:
            text.append(f"  {line}\n")
    if view.details:
        text.append("\ndetails:\n", style="bold")
        for key, value in view.details:
            text.append(f"  {key}: {value}\n")
    if view.error:
        text.append("\nerror:\n", style="bold")
        text.append(view.error + "\n")
    if view.traceback:
        text.append("\ntraceback:\n", style="bold")
        text.append(view.traceback.rstrip() + "\n")
    text.rstrip()
    return text


def check_detail_text(check: CheckResult, changed: bool) -> Text:
    """The body of the check detail screen (pure, for tests)."""
    text = Text()
    text.append(f"{check.check_id}  {check.title}\n", style="bold")
    text.append(f"status: {check.status.value}")
    if changed:
        text.append("  (changed since the baseline)")
    text.append("\n")
    if check.subject:
        text.append(f"subject: {check.subject}\n")
    text.append(f"observed: {check.observed}\nexpected: {check.expected}\n")
    if check.why:
        text.append(f"\nwhy it matters:\n  {check.why}\n")
    if check.fix:
        text.append(f"\nhow to fix:\n  {check.fix}\n")
    if check.facts:
        text.append("\nfacts:\n", style="bold")
        for key, value in sorted(check.facts.items()):
            text.append(f"  {key}: {value}\n")
    text.rstrip()
    return text


def check_group_detail_text(checks: Sequence[CheckResult], changed_ids: frozenset[str]) -> Text:
    """The body of the details of a collapsed row (pure, for tests): one line per subject with what it observed, then
    the expectation, why and fix the rows share."""
    first = checks[0]
    text = Text()
    text.append(f"{first.check_id.partition(':')[0]}  {first.title}\n", style="bold")
    text.append(f"status: {first.status.value} ×{len(checks)}\n")
    expected = list(dict.fromkeys(c.expected for c in checks))
    if len(expected) == 1:
        text.append(f"expected: {expected[0]}\n")
    text.append(f"\n{len(checks)} rows:\n", style="bold")
    for check in checks:
        changed = "  (changed since the baseline)" if check.check_id in changed_ids else ""
        own = f" (expected: {check.expected})" if len(expected) > 1 else ""
        text.append(f"  {check.subject or check.check_id}: {check.observed}{own}{changed}\n")
    if first.why:
        text.append(f"\nwhy it matters:\n  {first.why}\n")
    if first.fix:
        text.append(f"\nhow to fix:\n  {first.fix}\n")
    text.rstrip()
    return text


class ProbeDetailScreen(ModalScreen[None]):
    """Details of one probe."""

    DEFAULT_CSS = _CSS.format(name="ProbeDetailScreen")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "dismiss", "close", show=False)]

    def __init__(self, view: ProbeView, now_s: float) -> None:
        super().__init__()
        self.view = view
        self.now_s = now_s

    def compose(self) -> ComposeResult:
        """The detail text in a scroll box."""
        with VerticalScroll() as scroll:
            scroll.border_title = f"probe {self.view.probe_id}"
            yield Static(probe_detail_text(self.view, self.now_s), id="probe-detail-body")


class CheckDetailScreen(ModalScreen[None]):
    """Why a check matters and how to fix it."""

    DEFAULT_CSS = _CSS.format(name="CheckDetailScreen")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "dismiss", "close", show=False)]

    def __init__(self, check: CheckResult, changed: bool) -> None:
        super().__init__()
        self.check = check
        self.changed = changed

    def compose(self) -> ComposeResult:
        """The detail text in a scroll box."""
        with VerticalScroll() as scroll:
            scroll.border_title = f"check {self.check.check_id}"
            yield Static(check_detail_text(self.check, self.changed), id="check-detail-body")


class CheckGroupDetailScreen(ModalScreen[None]):
    """Every check of a collapsed row of the health table (one check id and status, many subjects)."""

    DEFAULT_CSS = _CSS.format(name="CheckGroupDetailScreen")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "dismiss", "close", show=False)]

    def __init__(self, checks: Sequence[CheckResult], changed_ids: frozenset[str]) -> None:
        super().__init__()
        self.checks = tuple(checks)
        self.changed_ids = changed_ids

    def compose(self) -> ComposeResult:
        """The detail text in a scroll box."""
        with VerticalScroll() as scroll:
            first = self.checks[0]
            scroll.border_title = f"check {first.check_id.partition(':')[0]} · {first.status.value} ×{len(self.checks)}"
            yield Static(check_group_detail_text(self.checks, self.changed_ids), id="check-group-detail-body")
