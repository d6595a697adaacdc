"""Provides BudgetDetailsScreen (`b`): where each figure of the budget came from, why probes are not running beside
a serving engine, and the stored records of other scenarios that the budget never takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from decodetop.history import format_ago
from decodetop.inert import inert
from decodetop.tui.model import BudgetView
from decodetop.tui.other_scenarios import OtherScenario, others_summary


@dataclass(frozen=True)
class BudgetDetails:
    """What the screen shows."""

    view: BudgetView | None
    """The composition on screen (None while the first one is on its way)."""
    held_line: str = ""
    """Why probes did not start (GPUs held by other processes), or ""."""
    stored_line: str = ""
    """The stored results that feed this budget (`stored_line`), or ""."""
    others: tuple[OtherScenario, ...] = ()


def budget_details_text(details: BudgetDetails, now_s: float) -> Text:
    """The body of the screen (pure, for tests). Every line is passed through `inert`: provenance, the stored line
    and the other scenarios' fingerprints come from the history file (outside text)."""
    text = Text()

    def add(line: str, style: str = "") -> None:  # the line's own newlines kept, every control inside it marked
        body = line.strip("\n")
        start = line.index(body) if body else len(line)
        text.append(line[:start] + inert(body) + line[start + len(body) :], style=style)

    view = details.view
    if details.held_line:
        add(f"{details.held_line}\n\n", style="bold")
    if view is not None:
        for warning in view.warnings:
            add(f"{warning}\n\n", style="bold")
        add(f"{view.title}\n", style="bold")
        for line in view.header.splitlines():
            add(f"{line}\n")
        if view.observed_text:
            add(f"observed step: {view.observed_text}\n")
        if view.contention:
            add(f"{view.contention}\n", style="bold")
        add("\nwhere each figure comes from:\n", style="bold")
        for seg in view.components:
            add(f"  {seg.label}: ")
            add(f"{seg.provenance or seg.status}\n", style="" if seg.status == "measured" else "dim")
            if seg.kernels:
                add(f"    kernel: {seg.kernels}\n", style="dim")
    if details.stored_line:
        add(f"\n{details.stored_line}\n")
    add("\nother scenarios", style="bold")
    if not details.others:
        add(": none stored\n")
        return text
    add(f": {others_summary(details.others)}, listed here and never mixed into this budget\n")
    for other in details.others:
        add(f"  {other.line(now_s)}\n")
        if other.fingerprint is not None:
            add(f"    {other.fingerprint.describe()}\n", style="dim")
    text.rstrip()
    return text


class BudgetDetailsScreen(ModalScreen[None]):
    """The budget's provenance and the other scenarios, in a scroll box; escape, q, b or enter closes it."""

    DEFAULT_CSS = """
    BudgetDetailsScreen { align: center middle; }
    BudgetDetailsScreen > VerticalScroll { width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,b,enter", "dismiss", "close", show=False)]

    def __init__(self, details: BudgetDetails, now_s: float) -> None:
        super().__init__()
        self.details = details
        self.now_s = now_s

    def compose(self) -> ComposeResult:
        """The text in a scroll box."""
        with VerticalScroll() as scroll:
            scroll.border_title = "budget details"
            yield Static(budget_details_text(self.details, self.now_s), id="budget-details-body")


def stored_line(probes: int, newest_at_s: float | None, now_s: float) -> str:
    """ "the stored results of 8 probes of this scenario feed the budget, newest 2h ago", or that none does."""
    if probes == 0 or newest_at_s is None:
        return "no stored result of this scenario feeds the budget"
    what = "1 probe" if probes == 1 else f"{probes} probes"
    return (
        f"the stored results of {what} of this scenario feed the budget, newest "
        f"{format_ago(max(0.0, now_s - newest_at_s))}"
    )
