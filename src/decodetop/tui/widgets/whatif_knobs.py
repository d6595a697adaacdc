"""Provides WhatIfKnobs: the what-if screen's knobs, one cell each ("p/P TP 2→4"): the keys that turn it, its name,
the current deployment's value and, where the variant turned it, the variant's; the chart's axis marked. Cells flow
over as many lines as the width needs (four at 80 columns, two at 160)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from decodetop.tui.screens.whatif_knobs import KNOB_TABLE, Knob, KnobState
from decodetop.tui.sources.whatif_views import tick_label

CELL_GAP = 2
"""Spaces between two cells."""
AXIS_MARK = "◆"
"""Before the chart's axis knob (it reads without colour too)."""


class WhatIfKnobs(Widget):
    """The knobs and their values; the screen sets `state` and `axis`."""

    DEFAULT_CSS = """
    WhatIfKnobs { height: auto; padding: 0 1; }
    WhatIfKnobs > .whatif-knobs--key { color: $accent; text-style: bold; }
    WhatIfKnobs > .whatif-knobs--turned { color: $state-warn; text-style: bold; }
    WhatIfKnobs > .whatif-knobs--muted { color: $state-muted; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"whatif-knobs--key", "whatif-knobs--turned", "whatif-knobs--muted"}

    state: reactive[KnobState | None] = reactive(None)
    axis: reactive[str] = reactive("batch")

    def watch_state(self) -> None:
        """A re-layout only where the cells now take another number of lines (the first state: each cell is as wide
        as with its widest value, so turning a knob does not), else a repaint: no re-flow of the screen per key."""
        width = self.content_size.width
        if not width or len(self._lines(width)) != self.content_size.height:
            self.refresh(layout=True)

    def _cell(self, knob: Knob, state: KnobState) -> Text:
        key = self.get_component_rich_style("whatif-knobs--key", partial=True)
        turned = self.get_component_rich_style("whatif-knobs--turned", partial=True)
        muted = self.get_component_rich_style("whatif-knobs--muted", partial=True)
        cell = Text()
        cell.append(AXIS_MARK if knob.name == self.axis else " ", style=key)
        cell.append(f"{knob.down}/{knob.up}", style=key)
        cell.append(f" {knob.title} ")
        now = tick_label(state.now[knob.name])
        if knob.name in state.turned:
            cell.append(now, style=muted)
            cell.append("→" + tick_label(state.turned[knob.name]), style=turned)
        else:
            cell.append(now)
        # as wide as with its widest variant value and the arrow, so turning a knob never re-flows the cells (nor
        # resizes the chart): mark, "p/P", " TP ", now, "→", the value
        widest = max(len(tick_label(v)) for v in knob.steps(state.now[knob.name]))
        cell.pad_right(len(knob.down) + len(knob.up) + len(knob.title) + len(now) + widest + 5 - cell.cell_len)
        return cell

    def _lines(self, width: int) -> list[Text]:
        state = self.state
        if state is None:
            return [Text("reading the results…")]
        lines: list[Text] = []
        line = Text()
        for knob in KNOB_TABLE:
            cell = self._cell(knob, state)
            if line.cell_len and line.cell_len + CELL_GAP + cell.cell_len > width:
                lines.append(line)
                line = Text()
            if line.cell_len:
                line.append(" " * CELL_GAP)
            line.append_text(cell)
        lines.append(line)
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """As many lines as the cells need at this width."""
        return len(self._lines(width))

    def render(self) -> Text:
        """The cells, flowed to the width."""
        return Text("\n").join(self._lines(self.content_size.width or 80))
