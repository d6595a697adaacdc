"""Provides WhatIfCompare: the current deployment beside the variant, each a stacked bar of its components on one
shared scale (the main bar's colours and fill patterns, estimates hatched and dimmed) and its figures: step ms with
its 80 % range, calibrated ms, tok/s per sequence and in all, the component that limits it, Δ against now and the
labels saying how far each figure is from a measurement (CPU, interpolated, extrapolated, transferred, roofline).
The figures flow over as many lines as the width needs."""

from __future__ import annotations

import textwrap
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from decodetop.textfmt import format_number
from decodetop.themes.palette import SEGMENT_KEYS, segment_pattern, segment_variable
from decodetop.tui.sources.whatif_views import DeploymentRow, WhatIfView

NAME_WIDTH = 9
"""'variant' and a space before each bar."""
MIN_FIGURE_LINES = 2
"""Lines each row's figures take at least (step, range, tok/s; limiting component, Δ, labels at 80 columns)."""
ESTIMATE_GAP = "·"
"""Every other cell of a roofline estimate (the main bar's hatching)."""
_SEGMENTS = {key: f"whatif-compare--{segment_variable(key)}" for key in SEGMENT_KEYS}
_ROLES = ("title", "muted", "warn", "better", "worse", "target", "step")


def _css() -> str:
    rules = [
        "WhatIfCompare { height: auto; padding: 0 1; }",
        "WhatIfCompare > .whatif-compare--title { text-style: bold; }",
        "WhatIfCompare > .whatif-compare--muted { color: $state-muted; }",
        "WhatIfCompare > .whatif-compare--warn { color: $state-warn; text-style: bold; }",
        "WhatIfCompare > .whatif-compare--better { color: $state-ok; text-style: bold; }",
        "WhatIfCompare > .whatif-compare--worse { color: $state-bad; text-style: bold; }",
        "WhatIfCompare > .whatif-compare--target { color: $mark-target; text-style: bold; }",
        "WhatIfCompare > .whatif-compare--step { text-style: bold; }",
    ]
    rules += [f"WhatIfCompare > .{cls} {{ color: ${segment_variable(key)}; }}" for key, cls in _SEGMENTS.items()]
    return "\n".join(rules)


def _ms(value: float) -> str:
    return f"{format_number(value)} ms"


class WhatIfCompare(Widget):
    """The two deployments; the screen sets `view` (None while the first prediction is on its way)."""

    DEFAULT_CSS = _css()
    COMPONENT_CLASSES: ClassVar[set[str]] = {*_SEGMENTS.values(), *(f"whatif-compare--{r}" for r in _ROLES)}

    view: reactive[WhatIfView | None] = reactive(None)
    target_ms: reactive[float] = reactive(0.0)
    pending: reactive[str] = reactive("")
    """The variant being predicted ('tp=4 batch=8'), while the one drawn is the previous key's ('': none)."""
    compact: reactive[bool] = reactive(False, layout=True)
    """Short terminals: no knob list (the knobs above say it), no weakest figure, a reason's head only, no scale."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._tallest: dict[tuple[int, bool], int] = {}
        """(width, compact) → the most lines the rows took at it."""

    def watch_view(self) -> None:
        self._relayout_if_taller()

    def watch_pending(self) -> None:
        self._relayout_if_taller()

    def _relayout_if_taller(self) -> None:
        """A re-layout only where the rows now need more lines than they took at this width (a reason that takes
        a line of its own): otherwise a repaint, and the screen is not re-flowed on every key press."""
        width = self.content_size.width
        if not width or len(self._lines(width)) > self._tallest.get((width, self.compact), 0):
            self.refresh(layout=True)

    def _style(self, role: str) -> Style:
        cls = role if role.startswith("whatif-compare--") else f"whatif-compare--{role}"
        return self.get_component_rich_style(cls, partial=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """As many lines as the two rows need at this width, and never fewer than the most they needed at it: the
        chart below keeps its size (and is not redrawn) as knobs turn back and forth."""
        key = (width, self.compact)
        self._tallest[key] = max(len(self._lines(width)), self._tallest.get(key, 0))
        return self._tallest[key]

    def render(self) -> Text:
        """Both rows, flowed to the width."""
        return Text("\n").join(self._lines(max(20, self.content_size.width or 80)))

    def _lines(self, width: int) -> list[Text]:
        view = self.view
        if view is None:
            return [Text("predicting from the curves…", style=self._style("muted"))]
        rows = (view.now, view.variant)
        scale = max([r.total_ms or 0.0 for r in rows] + [self.target_ms]) or 1.0
        lines: list[Text] = []
        for row in rows:
            lines.append(self._bar(row, width, scale))
            figures = self._figures(row, width)
            lines.extend(figures + [Text()] * (MIN_FIGURE_LINES - len(figures)))  # a steady height
        if not self.compact:
            lines.append(self._scale_line(width, scale))
        return lines

    def _bar(self, row: DeploymentRow, width: int, scale_ms: float) -> Text:
        text = Text(row.name.ljust(NAME_WIDTH), style=self._style("title"))
        cells = max(10, width - NAME_WIDTH)
        if not row.parts:
            text.append("no figure", style=self._style("muted"))
            return text
        drawn, position = 0, 0.0
        for part in row.parts:
            position += part.ms
            end = max(drawn + 1, round(position / scale_ms * cells)) if part.ms > 0 else drawn
            style = self._style(_SEGMENTS.get(part.key, _SEGMENTS["unexplained"]))
            if part.estimated:
                style += Style(dim=True)
            for n in range(drawn, min(end, cells)):
                glyph = ESTIMATE_GAP if part.estimated and (n - drawn) % 2 else segment_pattern(part.key)
                text.append(glyph, style=style)
            drawn = min(end, cells)
        return text

    def _figures(self, row: DeploymentRow, width: int) -> list[Text]:
        """The row's figures as cells joined by ' · ', flowed over lines indented under the bar."""
        cells: list[Text] = [] if self.compact else [Text(row.knobs, style=self._style("muted"))]
        if self.pending and row.name == "variant":
            cells.insert(0, Text(f"predicting {self.pending}…; shown:", style=self._style("warn")))
        if row.total_ms is not None:
            step = _ms(row.step_ms) if row.step_ms is not None else f"≥ {_ms(row.total_ms)}"
            cells.append(Text(f"step {step}", style=self._style("step")))
        if row.range_ms is not None and format_number(row.range_ms[0]) != format_number(row.range_ms[1]):
            cells.append(Text(f"80 % {format_number(row.range_ms[0])}–{_ms(row.range_ms[1])}"))
        if row.calibrated_ms is not None:
            cells.append(Text(f"calibrated {_ms(row.calibrated_ms)}"))
        if row.tokens_per_s is not None:
            cells.append(Text(f"{format_number(row.tokens_per_s)} tok/s/seq"))
        if row.tokens_per_s_total is not None:
            cells.append(Text(f"{format_number(row.tokens_per_s_total)} tok/s in all"))
        if row.limiting:
            cells.append(Text(f"limited by {row.limiting}"))
        if row.delta_pct is not None:
            cells.append(
                Text(f"Δ {row.delta_pct:+.0f} %", style=self._style("better" if row.delta_pct < 0 else "worse"))
            )
        if row.labels:
            cells.append(Text(", ".join(row.labels), style=self._style("muted")))
        if row.weakest and not self.compact:
            cells.append(Text(f"weakest: {row.weakest}", style=self._style("muted")))
        if row.problem:
            problem = "; ".join(p.split(":")[0] for p in row.problem.split("; ")) if self.compact else row.problem
            cells.append(Text(problem, style=self._style("warn")))
        return _flow(cells, width, NAME_WIDTH)

    def _scale_line(self, width: int, scale_ms: float) -> Text:
        text = Text(" " * NAME_WIDTH)
        text.append(f"bars 0–{_ms(scale_ms)}", style=self._style("muted"))
        if self.target_ms > 0:
            text.append(" · target ", style=self._style("muted"))
            text.append(f"{_ms(self.target_ms)}/step", style=self._style("target"))
        text.truncate(width, overflow="ellipsis")
        return text


def _flow(cells: list[Text], width: int, indent: int) -> list[Text]:
    """`cells` joined by ' · ' over lines of `width`, each line indented; a cell longer than a line is wrapped at
    its words onto lines of its own (never cut)."""
    room = max(10, width - indent)
    lines: list[Text] = []
    line = Text()
    for cell in cells:
        if cell.cell_len > room:  # a long reason: lines of its own
            if line.cell_len:
                lines.append(line)
            lines.extend(Text(piece, style=cell.style) for piece in textwrap.wrap(cell.plain, room))
            line = Text()
            continue
        if line.cell_len and line.cell_len + 3 + cell.cell_len > room:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(" · ")
        line.append_text(cell)
    if line.cell_len:
        lines.append(line)
    return [Text(" " * indent) + line for line in lines]
