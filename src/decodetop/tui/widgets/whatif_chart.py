"""Provides WhatIfChart: tok/s per sequence (left axis) and in all (right axis) over one knob's values, the other
knobs at the variant's, with the target tok/s per sequence as a line where it falls near the curve and the
variant's value marked. A `SafePlot` drawn through its own `.plt`; colours from the theme's variables. Where only
its height changed (the comparison above grew a line), the last drawing stays for that frame and the plot is drawn
again after it: plotext takes several ms, the comparison's frame does not wait on it."""

from __future__ import annotations

from textual.app import RenderResult
from textual.color import Color
from textual.geometry import Size

from decodetop.tui.sources.whatif_views import AxisSeries
from decodetop.tui.widgets.charts import SafePlot

TARGET_SHOWN_WITHIN = 3.0
"""The target line is drawn where it is at most this many times the best tok/s per sequence (above that it would
flatten the curve to the floor; the title says where it is instead)."""


class WhatIfChart(SafePlot):
    """The chart of one axis; `show` re-plots it (None: still predicting)."""

    DEFAULT_CSS = "WhatIfChart { height: 1fr; min-height: 8; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series: AxisSeries | None = None
        self._drawing: RenderResult | None = None
        """The last drawing of the series held (None: to be drawn), at `_drawn_size`."""
        self._drawn_size = Size(0, 0)
        self._kept_once = False

    def on_mount(self) -> None:
        """Re-plot on a theme change so colours follow the theme."""
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.call_after_refresh(self.replot))
        self.replot()

    def show(self, series: AxisSeries | None) -> None:
        """New series."""
        self.series = series
        self.replot()

    def render(self) -> RenderResult:
        """The plot; the last drawing once more where only the height changed since it (redrawn after the frame)."""
        size = self.size
        resized = size != self._drawn_size and size.width == self._drawn_size.width
        if self._drawing is not None and resized and not self._kept_once:
            self._kept_once = True
            self.call_after_refresh(self.refresh)
            return self._drawing
        self._kept_once = False
        self._drawing = super().render()
        self._drawn_size = size
        return self._drawing

    def _colour(self, variable: str) -> tuple[int, int, int]:
        colour = Color.parse(self.app.theme_variables.get(variable, "#888888"))
        return colour.r, colour.g, colour.b

    def replot(self) -> None:
        """Draw the series held."""
        self._drawing = None
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        s = self.series
        if s is None:
            plt.title("tok/s over an axis — predicting…")
            self.refresh()
            return
        xs = [float(i) for i in range(len(s.values))]
        per_seq = [(x, y) for x, y in zip(xs, s.tokens_per_s, strict=True) if y is not None]
        in_all = [(x, y) for x, y in zip(xs, s.tokens_per_s_total, strict=True) if y is not None]
        title = s.title
        if per_seq:
            plt.plot(
                *zip(*per_seq, strict=True), label="tok/s per sequence", color=self._colour("accent"), marker="braille"
            )
        if in_all:
            plt.plot(
                *zip(*in_all, strict=True),
                label="tok/s in all (right)",
                color=self._colour("secondary"),
                marker="braille",
                yside="right",
            )
        best = max((y for _, y in per_seq), default=0.0)
        if per_seq and s.target_tps <= TARGET_SHOWN_WITHIN * best:
            plt.hline(s.target_tps, color=self._colour("mark-target"))
            title += f" · target {s.target_tps:g} tok/s/seq: the flat line"
        elif per_seq:
            title += f" · target {s.target_tps:g} tok/s/seq: above the chart"
        if not per_seq:
            title += " — no point has a figure (see below)"
        plt.vline(s.variant_index, color=self._colour("mark-observed"))
        plt.xticks(xs, list(s.values))
        plt.title(title)
        self.refresh()
