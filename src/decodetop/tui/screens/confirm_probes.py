"""Provides ConfirmProbesScreen: the consent asked before probes run on GPUs that other processes hold (a serving
engine); dismisses with True to run them anyway, False to leave the engine alone."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from decodetop.inert import inert
from decodetop.pipeline.gpu_guard import HeldGpus

WARNING = (
    "Probes compete with production traffic: while they run they take GPU time, memory bandwidth, NVLink/PCIe "
    "and GPU memory from the engine, so its requests slow down, and its load makes the probes' figures read slow."
)
"""What the modal says before anything runs beside a serving engine."""


def confirm_text(held: HeldGpus, probes: int) -> Text:
    """The modal's body (pure, for tests)."""
    text = Text()
    text.append(f"{inert(held.who)}.\n\n", style="bold")  # process names: any user on the host picks them
    text.append(f"{WARNING}\n\n")
    plural = "s" if probes != 1 else ""
    text.append(f"Run {probes} probe{plural} anyway? ", style="bold")
    text.append("y runs them (and later ones this session), n or escape leaves the engine alone.")
    return text


class ConfirmProbesScreen(ModalScreen[bool]):
    """A warning with two buttons; "leave it" has the focus, so a stray enter runs nothing."""

    DEFAULT_CSS = """
    ConfirmProbesScreen { align: center middle; }
    ConfirmProbesScreen > Vertical { width: 80; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 0 1; }
    ConfirmProbesScreen #confirm-buttons { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmProbesScreen Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "run", "run anyway", show=False),
        Binding("n,escape,q", "leave", "leave it", show=False),
    ]

    def __init__(self, held: HeldGpus, probes: int) -> None:
        super().__init__()
        self.held = held
        self.probes = probes

    def compose(self) -> ComposeResult:
        """The warning and the two buttons."""
        with Vertical() as box:
            box.border_title = "GPUs in use by other processes"
            yield Static(confirm_text(self.held, self.probes), id="confirm-body")
            with Horizontal(id="confirm-buttons"):
                yield Button("leave the engine alone (n)", id="leave", variant="primary")
                yield Button("run anyway (y)", id="run", variant="warning")

    def on_mount(self) -> None:
        """Focus the safe choice."""
        self.query_one("#leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Either button."""
        self.dismiss(event.button.id == "run")

    def action_run(self) -> None:
        """`y`: run anyway."""
        self.dismiss(True)

    def action_leave(self) -> None:
        """`n` / escape: run nothing."""
        self.dismiss(False)
