"""Provides Charts: all-reduce latency vs size (log-log, a line per mode), GEMM GB/s vs M, and per-GPU time series of
utilisation, memory, SM clock, PCIe throughput, power and temperature. Each plot is a `PlotextPlot` drawn through its
own `.plt` (never the global plotext module); line colours come from the theme's segment variables."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.color import Color
from textual.containers import Grid
from textual_plotext import PlotextPlot

from decodetop.textfmt import format_bytes
from decodetop.themes.palette import SEGMENT_KEYS, segment_variable
from decodetop.tui.model import ProbeCurves, Series
from decodetop.tui.widgets.telemetry_history import SERIES, TelemetryHistory

_PLOTS = (
    ("chart-allreduce", "all-reduce latency µs vs size (log-log)"),
    ("chart-gemm", "GEMM achieved GB/s vs M"),
    ("chart-util", "utilisation % per GPU"),
    ("chart-mem", "memory used GiB per GPU"),
    ("chart-sm", "SM clock MHz per GPU"),
    ("chart-pcie", "PCIe TX+RX GB/s per GPU"),
    ("chart-power", "power W per GPU"),
    ("chart-temp", "temperature °C per GPU"),
)


class SafePlot(PlotextPlot):
    """A PlotextPlot that shows plotext's own failures (it raises on some sizes and log axes) as a line of text
    instead of taking the app down."""

    def render(self) -> RenderResult:
        """The plot, or why it could not be drawn."""
        try:
            return super().render()
        except (IndexError, ValueError, ZeroDivisionError) as exc:
            return Text(f"plot not drawn at this size ({type(exc).__name__})", style="italic")


class Charts(Grid):
    """Eight plots in a grid (two probe curves, six per-GPU histories); `show_curves` and `show_history` re-plot
    them."""

    DEFAULT_CSS = """
    Charts { grid-size: 2; grid-rows: 14; grid-gutter: 0 1; height: 1fr; overflow-y: auto; }
    Charts > PlotextPlot { height: 14; }
    """

    def __init__(self, curves: ProbeCurves, history: TelemetryHistory, now_s: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.curves = curves
        """Probe curves shown."""
        self.history = history
        """Telemetry rings shown."""
        self.now_s = now_s

    def compose(self) -> ComposeResult:
        """One PlotextPlot per chart."""
        for plot_id, _ in _PLOTS:
            yield SafePlot(id=plot_id)

    def on_mount(self) -> None:
        """Plot what is held; re-plot on theme change so colours follow the theme."""
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.call_after_refresh(self.replot))
        self.replot()

    def _colours(self) -> list[tuple[int, int, int]]:
        variables = self.app.theme_variables
        out = []
        for key in SEGMENT_KEYS[:-1]:
            colour = Color.parse(variables.get(segment_variable(key), "#888888"))
            out.append((colour.r, colour.g, colour.b))
        return out

    def _plot(self, plot_id: str) -> PlotextPlot:
        return self.query_one(f"#{plot_id}", PlotextPlot)

    def show_curves(self, curves: ProbeCurves) -> None:
        """New probe curves."""
        self.curves = curves
        self.replot()

    def show_history(self, history: TelemetryHistory, now_s: float) -> None:
        """New telemetry (called at the telemetry tick while the charts are visible)."""
        self.history = history
        self.now_s = now_s
        self.replot()

    def replot(self) -> None:
        """Redraw every plot from the data held."""
        colours = self._colours()
        titles = dict(_PLOTS)
        self._draw_xy("chart-allreduce", titles, self.curves.allreduce_us_by_mode, colours, log=True)
        self._draw_xy("chart-gemm", titles, self.curves.gemm_gbps_by_shape, colours, log=False)
        for name in SERIES:
            series = [
                Series(
                    label=f"GPU{index}",
                    x=tuple(t - self.now_s for t, _ in points),
                    y=tuple(v for _, v in points),
                )
                for index, points in sorted(self.history.series[name].items())
            ]
            self._draw_xy(f"chart-{name}", titles, series, colours, log=False, xlabel="seconds ago")

    def _draw_xy(  # noqa: PLR0917
        self,
        plot_id: str,
        titles: dict[str, str],
        series: Sequence[Series],
        colours: list[tuple[int, int, int]],
        log: bool,
        xlabel: str = "",
    ) -> None:
        widget = self._plot(plot_id)
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(titles[plot_id])
        drawn = False
        xs_all: list[float] = []
        ys_all: list[float] = []
        for i, line in enumerate(series):
            points = [(x, y) for x, y in zip(line.x, line.y, strict=True) if not log or (x > 0 and y > 0)]
            if not points:
                continue
            xs = [math.log2(p[0]) if log else p[0] for p in points]
            ys = [math.log10(p[1]) if log else p[1] for p in points]
            xs_all.extend(xs)
            ys_all.extend(ys)
            plt.plot(xs, ys, label=line.label, color=colours[i % len(colours)], marker="braille")
            drawn = True
        if log and drawn:
            # plotext's own log axes raise at some sizes: plot log2(bytes), log10(µs) and label ticks in real units
            xt = [float(t) for t in range(5 * math.floor(min(xs_all) / 5), math.ceil(max(xs_all)) + 1, 5)]
            plt.xticks(xt, [format_bytes(2.0**t).replace(" ", "") for t in xt])  # 1B, 32B, 1KiB, 32KiB ...
            yt = [float(t) for t in range(math.floor(min(ys_all)), math.ceil(max(ys_all)) + 1)]
            plt.yticks(yt, [f"{10.0**t:g}" for t in yt])
        if xlabel:
            plt.xlabel(xlabel)
        if not drawn:
            plt.title(titles[plot_id] + " — no data yet")
        widget.refresh()
