"""Provides ModelPickerScreen: choose a model preset (`m`); dismisses with the name, or None when cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import OptionList
from textual.widgets.option_list import Option


class ModelPickerScreen(ModalScreen[str | None]):
    """An option list of model presets with the current one highlighted."""

    DEFAULT_CSS = """
    ModelPickerScreen { align: center middle; }
    ModelPickerScreen > OptionList { width: 80; max-width: 95%; height: auto; max-height: 80%;
        border: round $primary; background: $surface; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "cancel", "cancel", show=False)]

    def __init__(self, models: Sequence[tuple[str, str]], current: str) -> None:
        super().__init__()
        self.models = list(models)
        self.current = current

    def compose(self) -> ComposeResult:
        """The list."""
        options = [Option(f"{name}  {desc}" if desc else name, id=name) for name, desc in self.models]
        picker = OptionList(*options, id="model-options")
        picker.border_title = "model (enter picks, escape cancels)"
        yield picker

    def on_mount(self) -> None:
        """Highlight the current model."""
        picker = self.query_one(OptionList)
        for index, (name, _) in enumerate(self.models):
            if name == self.current:
                picker.highlighted = index
        picker.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Pick."""
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        """Keep the current model."""
        self.dismiss(None)
