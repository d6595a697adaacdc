"""Provides TpPickerScreen: choose the tensor-parallel degree (`p`); dismisses with `TpChoice`, or None when
cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import OptionList
from textual.widgets.option_list import Option

TP_DEGREES = (1, 2, 4, 8)
"""Degrees offered: the powers of two up to a full 8-GPU host (docs/reference/models.md: the seed deployment is TP8)."""
AUTO = "auto"


@dataclass(frozen=True)
class TpChoice:
    """What was picked: a degree, or None for automatic (the number of probe ranks)."""

    tp: int | None


def tp_options(gpu_count: int, current: int | None) -> list[tuple[str, str]]:
    """(option id, label) for each choice: automatic, the usual degrees, the host's GPU count and the current
    degree when they are not among them; degrees above the GPU count are marked."""
    degrees = sorted({*TP_DEGREES, *((gpu_count,) if gpu_count > 0 else ()), *((current,) if current else ())})
    out = [(AUTO, f"auto (the number of probe ranks{f', {gpu_count} GPUs here' if gpu_count else ''})")]
    for tp in degrees:
        note = f"  more than the {gpu_count} GPUs here" if gpu_count and tp > gpu_count else ""
        out.append((str(tp), f"TP {tp}{note}"))
    return out


class TpPickerScreen(ModalScreen[TpChoice | None]):
    """An option list of tensor-parallel degrees with the current one highlighted."""

    DEFAULT_CSS = """
    TpPickerScreen { align: center middle; }
    TpPickerScreen > OptionList { width: 60; max-width: 95%; height: auto; max-height: 80%;
        border: round $primary; background: $surface; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "cancel", "cancel", show=False)]

    def __init__(self, options: Sequence[tuple[str, str]], current: int | None) -> None:
        super().__init__()
        self.options = list(options)
        self.current = AUTO if current is None else str(current)

    def compose(self) -> ComposeResult:
        """The list."""
        picker = OptionList(*(Option(label, id=key) for key, label in self.options), id="tp-options")
        picker.border_title = "tensor parallel (enter picks, escape cancels)"
        yield picker

    def on_mount(self) -> None:
        """Highlight the current degree."""
        picker = self.query_one(OptionList)
        for index, (key, _) in enumerate(self.options):
            if key == self.current:
                picker.highlighted = index
        picker.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Pick."""
        key = event.option.id
        self.dismiss(TpChoice(None if key == AUTO or key is None else int(key)))

    def action_cancel(self) -> None:
        """Keep the current degree."""
        self.dismiss(None)
