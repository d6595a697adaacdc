"""Provides Charts: all-reduce latency vs size (log-log, a line per mode), GEMM GB/s vs M, the observed step (and tok/s
per stream) over time, each component since the baseline, and per-GPU time series of utilisation (on a 0–100 axis),
memory, SM clock, PCIe throughput, power and temperature over the last ten minutes. Each plot is a `PlotextPlot` drawn
through its own `.plt` (never the global plotext module), its axes named with their units, integer ticks where the
axis counts, and its legend under the plot (in its border), never over the curves; line colours come from the
theme's segment variables."""

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
from decodetop.tui.widgets.budget_history import BudgetHistory
from decodetop.tui.widgets.telemetry_history import SERIES, TelemetryHistory

_PLOTS = (
    ("chart-allreduce", "all-reduce vs size (log-log)"),
    ("chart-gemm", "GEMM bandwidth vs M"),
    ("chart-step", "observed step (tok/s per stream)"),
    ("chart-components", "components since the baseline"),
    ("chart-util", "utilisation per GPU"),
    ("chart-mem", "memory used per GPU"),
    ("chart-sm", "SM clock per GPU"),
    ("chart-pcie", "PCIe TX+RX per GPU"),
    ("chart-power", "power per GPU"),
    ("chart-temp", "temperature per GPU"),
)
Y_LABELS = {
    "chart-allreduce": "µs",
    "chart-gemm": "GB/s",
    "chart-step": "ms",
    "chart-components": "ms",
    "chart-util": "%",
    "chart-mem": "GiB",
    "chart-sm": "MHz",
    "chart-pcie": "GB/s",
    "chart-power": "W",
    "chart-temp": "°C",
}
"""Each plot's y axis, by its unit."""
WINDOW_MIN = 10.0
"""The time series show the last ten minutes (the telemetry keeps 30, downsampled)."""
Y_RANGES = {"chart-util": (0.0, 100.0)}
"""Fixed y ranges: utilisation reads against 0–100 %, so noise at 99–100 % never looks like a swing."""


MAX_TICKS = 8
"""At most this many integer ticks on the GEMM plot's M axis."""


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
    """Ten plots in a grid (two probe curves, the observed step and the components over time, six per-GPU
    histories); `show_history` re-plots them."""

    DEFAULT_CSS = """
    Charts { grid-size: 2; grid-rows: 15; grid-gutter: 0 1; height: 1fr; overflow-y: auto; }
    Charts > PlotextPlot { height: 15; border-bottom: solid $panel; border-subtitle-align: left; }
    """

    def __init__(
        self,
        curves: ProbeCurves,
        history: TelemetryHistory,
        now_s: float,
        budgets: BudgetHistory | None = None,
        budget_now_s: float | None = None,
        *,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.curves = curves
        """Probe curves shown."""
        self.history = history
        """Telemetry rings shown."""
        self.budgets = budgets or BudgetHistory()
        """The observed step and the components over time."""
        self.now_s = now_s
        """The telemetry's now (its newest frame: a replay's frames keep their own time)."""
        self.budget_now_s = now_s if budget_now_s is None else budget_now_s
        """The app's now, for the compositions it made."""

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

    def show_history(
        self, history: TelemetryHistory, now_s: float, budgets: BudgetHistory, budget_now_s: float
    ) -> None:
        """New telemetry or a new composition (called while the charts are visible): `now_s` is the newest
        frame's time, `budget_now_s` the app's clock."""
        self.history = history
        self.budgets = budgets
        self.now_s = now_s
        self.budget_now_s = budget_now_s
        self.replot()

    @staticmethod
    def _minutes_ago(label: str, points: Sequence[tuple[float, float]], now_s: float) -> Series:
        """A time series as minutes before `now_s` (the last `WINDOW_MIN` of it)."""
        kept = [(t, v) for t, v in points if now_s - t <= WINDOW_MIN * 60]
        return Series(label, tuple((t - now_s) / 60 for t, _ in kept), tuple(v for _, v in kept))

    def replot(self) -> None:
        """Redraw every plot from the data held."""
        colours = self._colours()
        titles = dict(_PLOTS)
        self._draw_xy("chart-allreduce", titles, self.curves.allreduce_us_by_mode, colours, log=True)
        gemm = [  # M on a log2 axis (1, 2, 4 … 256 spread evenly), ticked with the integer Ms measured
            Series(s.label, tuple(math.log2(x) for x, _ in kept), tuple(y for _, y in kept))
            for s in self.curves.gemm_gbps_by_shape
            if (kept := [(x, y) for x, y in zip(s.x, s.y, strict=True) if x > 0])
        ]
        self._draw_xy("chart-gemm", titles, gemm, colours, log=False, xlabel="M (rows)")
        step = [self._minutes_ago("observed step", self.budgets.observed.points(), self.budget_now_s)]
        self._draw_xy("chart-step", titles, step, colours, log=False, xlabel="minutes ago")
        self._draw_components(titles, colours)
        for name in SERIES:
            series = [
                self._minutes_ago(f"GPU{index}", points.points(), self.now_s)
                for index, points in sorted(self.history.series[name].items())
            ]
            self._draw_xy(f"chart-{name}", titles, series, colours, log=False, xlabel="minutes ago")

    def _draw_components(self, titles: dict[str, str], colours: list[tuple[int, int, int]]) -> None:
        """Each component's figure against minutes since the baseline (since the first composition without one)."""
        rings = self.budgets.components
        start = self.budgets.baseline_at_s
        if start is None:
            start = min((r.points()[0][0] for r in rings.values() if len(r)), default=self.budget_now_s)
        series = [
            Series(
                self.budgets.labels.get(key, key),
                tuple((t - start) / 60 for t, _ in ring.points()),
                tuple(v for _, v in ring.points()),
            )
            for key, ring in rings.items()
            if len(ring)
        ]
        since = "minutes since the baseline" if self.budgets.baseline_at_s is not None else "minutes since the first"
        self._draw_xy("chart-components", titles, series, colours, log=False, xlabel=since)

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
        legend = Text()
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
            colour = colours[i % len(colours)]
            plt.plot(xs, ys, color=colour, marker="braille")  # no label: the legend goes under the plot
            legend.append(" ━ ", style=f"rgb({colour[0]},{colour[1]},{colour[2]})")
            legend.append(line.label)
        drawn = bool(xs_all)
        if drawn:
            self._ticks(plot_id, xs_all, ys_all, log=log)
        if xlabel == "minutes ago":  # the last ten minutes, whole minutes
            plt.xlim(-WINDOW_MIN, 0)
            plt.xticks(
                [float(m) for m in range(-int(WINDOW_MIN), 1, 2)], [str(m) for m in range(-int(WINDOW_MIN), 1, 2)]
            )
        elif xlabel.startswith("minutes since") and drawn:
            end = max(1, math.ceil(max(xs_all)))
            step = max(1, math.ceil(end / 5))
            plt.xlim(0, end)
            plt.xticks([float(m) for m in range(0, end + 1, step)], [str(m) for m in range(0, end + 1, step)])
        if plot_id in Y_RANGES:
            low, high = Y_RANGES[plot_id]
            plt.ylim(low, high)
            ticks = [low + (high - low) * k / 4 for k in range(5)]
            plt.yticks(ticks, [f"{y:.0f}" for y in ticks])
        plt.xlabel(xlabel or ("message size" if log else ""))
        plt.ylabel(Y_LABELS[plot_id])
        if not drawn:
            plt.title(titles[plot_id] + " — no data yet")
        widget.border_subtitle = legend if drawn else None
        widget.refresh()

    def _ticks(self, plot_id: str, xs: list[float], ys: list[float], *, log: bool) -> None:
        """Ticks in real units: on the log plot bytes and µs (plotext's own log axes raise at some sizes, so it
        plots log2(bytes) and log10(µs)); on the GEMM plot the integer Ms measured; on the step plot each
        figure's tok/s beside its ms."""
        plt = self._plot(plot_id).plt
        if log:
            xt = [float(t) for t in range(5 * math.floor(min(xs) / 5), math.ceil(max(xs)) + 1, 5)]
            plt.xticks(xt, [format_bytes(2.0**t).replace(" ", "") for t in xt])  # 1B, 32B, 1KiB, 32KiB ...
            low, high = min(ys), max(ys)  # 1-2-5 steps in each decade, so a narrow range still gets ticks
            yt = [
                math.log10(m * 10.0**d)
                for d in range(math.floor(low) - 1, math.ceil(high) + 1)
                for m in (1, 2, 5)
                if low - 1e-9 <= math.log10(m * 10.0**d) <= high + 1e-9
            ]
            plt.yticks(yt, [f"{10.0**t:.3g}" for t in yt])
        elif plot_id == "chart-gemm":
            steps = sorted(set(xs))
            shown = steps if len(steps) <= MAX_TICKS else steps[:: math.ceil(len(steps) / MAX_TICKS)]
            plt.xticks(shown, [str(round(2.0**x)) for x in shown])
        elif plot_id == "chart-step":
            low, high = min(ys), max(ys)
            yt = [low] if high - low < 1e-9 else [low + (high - low) * k / 3 for k in range(4)]
            plt.yticks(yt, [f"{y:.3g} ms, {1000.0 / y:.0f} tok/s" if y > 0 else f"{y:.3g} ms" for y in yt])
