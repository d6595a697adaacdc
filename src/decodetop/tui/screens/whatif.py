"""Provides WhatIfScreen (`w`): the current deployment beside a variant of it, predicted from the curves of the
results the budget composes from (`decodetop.pipeline.whatif.predict`, the one composition: no probe runs from
here), each knob turned by a key, and a chart of tok/s over one knob.

Work is off the event loop: one worker thread at a time predicts the newest knob state asked for (key presses
faster than a prediction coalesce into the last one), posts `WhatIfPredicted`, then the chart's points
(`WhatIfCharted`), then, while no newer key came, the neighbours of every knob, so the next key press finds its
variant kept and the bar re-composes at once. The screen is modal: the main screen's probe keys (r, R) do not
reach through it; escape or w returns to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from decodetop.pipeline.context import BudgetContext
from decodetop.settings import Settings
from decodetop.tui.layout import COMPACT_BELOW_ROWS
from decodetop.tui.screens.help import HelpScreen
from decodetop.tui.screens.whatif_knobs import KNOB_TABLE, KnobState, chart_axis, current_values, next_axis
from decodetop.tui.sources import BudgetSource
from decodetop.tui.sources.whatif import WhatIfPredictor
from decodetop.tui.sources.whatif_views import AxisSeries, WhatIfView, axis_points, axis_series, whatif_view
from decodetop.tui.widgets.whatif_chart import WhatIfChart
from decodetop.tui.widgets.whatif_compare import WhatIfCompare
from decodetop.tui.widgets.whatif_knobs import WhatIfKnobs

MAX_COMPACT_LINES = 2
"""Header lines a short terminal shows (the budget's own header first: CPU ranks, another GPU)."""
DEFAULT_AXIS = "batch"
"""The chart's first axis: the knob a serving engine's load turns most."""


@dataclass
class WhatIfPredicted(Message):
    """The comparison for knob state number `seq` (or why it could not be predicted)."""

    seq: int
    state: KnobState
    view: WhatIfView | None
    problem: str = ""


@dataclass
class WhatIfCharted(Message):
    """The chart's series for knob state number `seq`."""

    seq: int
    series: AxisSeries


def _bindings() -> list[BindingType]:
    out: list[BindingType] = [
        Binding("escape,w", "dismiss", "back"),
        Binding("question_mark", "help", "keys", key_display="?"),
        Binding("x", "next_axis", "chart axis"),
        Binding("0", "reset", "as now"),
        Binding("q", "app.quit", "quit", show=False),
    ]
    for knob in KNOB_TABLE:
        out.append(Binding(knob.down, f"turn('{knob.name}', -1)", f"{knob.title} down", show=False))
        out.append(Binding(knob.up, f"turn('{knob.name}', 1)", f"{knob.title} up", show=False))
    return out


def help_keys() -> list[tuple[str, str]]:
    """(key, what it does) for the screen's `?`."""
    keys = [(f"{k.down} / {k.up}", f"{k.title}: down / up (names wrap around)") for k in KNOB_TABLE]
    keys += [
        ("x", "the chart's axis: the next knob (◆ marks it)"),
        ("0", "every knob back to the current deployment"),
        ("escape / w", "back to the main screen"),
        ("q", "quit decodetop"),
    ]
    return keys


class WhatIfScreen(ModalScreen[None]):
    """The what-if screen over `base`: the budget's scenario and results when it opened."""

    DEFAULT_CSS = """
    WhatIfScreen { background: $background; }
    WhatIfScreen > Vertical { height: 1fr; }
    WhatIfScreen #whatif-title { padding: 0 1; text-style: bold; }
    WhatIfScreen #whatif-lines { padding: 0 1; color: $state-muted; }
    WhatIfScreen #whatif-notes { padding: 0 1; color: $state-muted; height: auto; max-height: 3; }
    """
    BINDINGS: ClassVar[list[BindingType]] = _bindings()

    def __init__(self, base: Callable[[], BudgetContext], target_tps: float) -> None:
        super().__init__()
        self._base = base
        """Builds the base context (called in the worker: it reads the budget source's fingerprints)."""
        self.target_tps = target_tps
        self.predictor: WhatIfPredictor | None = None
        self.state: KnobState | None = None
        self.axis = DEFAULT_AXIS
        self.view: WhatIfView | None = None
        self.series: AxisSeries | None = None
        self.seq = 0
        """The newest knob state asked for."""
        self.shown_seq = -1
        self.charted_seq = -1
        self.drawn_seq = -1
        """The knob state whose chart is drawn (after its comparison's repaint)."""
        self._wanted: tuple[int, KnobState | None, str] = (0, None, DEFAULT_AXIS)
        self._lock = threading.Lock()
        self._busy = False

    def compose(self) -> ComposeResult:
        """Title, where the figures come from, the knobs, the comparison, the chart, the footer."""
        with Vertical():
            yield Static("what-if", id="whatif-title", markup=False)
            yield Static("reading the results…", id="whatif-lines", markup=False)
            yield WhatIfKnobs(id="whatif-knobs")
            yield WhatIfCompare(id="whatif-compare")
            yield WhatIfChart(id="whatif-chart")
            yield Static("", id="whatif-notes", markup=False)
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        """Short terminals get the compact comparison and at most two header lines."""
        self.query_one(WhatIfCompare).compact = event.size.height < COMPACT_BELOW_ROWS
        self._show_lines()

    def _show_lines(self) -> None:
        """Where the figures come from (CPU ranks, another GPU, the results, the calibration): whole lines where the
        screen is tall, else the first two, each cut to the width with an ellipsis."""
        lines = self.view.lines if self.view is not None else ("reading the results…",)
        text = Text("\n".join(lines))
        if self.size.height < COMPACT_BELOW_ROWS:
            cut = []
            for line in lines[:MAX_COMPACT_LINES]:
                part = Text(line.split(" (", 1)[0] if line.endswith(")") else line)  # the flags: on a taller terminal
                part.truncate(max(10, self.size.width - 2), overflow="ellipsis")
                cut.append(part)
            text = Text("\n").join(cut)
        self.query_one("#whatif-lines", Static).update(text)

    def on_mount(self) -> None:
        """Predict the current deployment (and the chart) in the worker."""
        self.query_one(WhatIfCompare).target_ms = 1000.0 / self.target_tps if self.target_tps > 0 else 0.0
        self.query_one(WhatIfKnobs).axis = self.axis
        self._ask(None)

    @property
    def settled(self) -> bool:
        """True when the comparison and the chart on screen answer the newest key press (tests wait on it)."""
        return self.shown_seq == self.seq and self.drawn_seq == self.seq

    # -- keys --------------------------------------------------------------------------------------------------

    def action_turn(self, name: str, direction: int) -> None:
        """A knob one step down or up: the knobs redraw at once, the comparison when its prediction comes."""
        if self.state is None:
            return
        self.state = self.state.step(name, direction)
        self.query_one(WhatIfKnobs).state = self.state
        self._ask(self.state)

    def action_reset(self) -> None:
        """`0`: every knob back at the current deployment."""
        if self.state is not None:
            self.state = self.state.reset()
            self.query_one(WhatIfKnobs).state = self.state
            self._ask(self.state)

    def action_next_axis(self) -> None:
        """`x`: the chart over the next knob."""
        self.axis = next_axis(self.axis)
        self.query_one(WhatIfKnobs).axis = self.axis
        self._ask(self.state)

    def action_help(self) -> None:
        """`?`: this screen's keys."""
        self.app.push_screen(HelpScreen(help_keys()))

    # -- the worker ----------------------------------------------------------------------------------------------

    def _ask(self, state: KnobState | None) -> None:
        """Ask for the comparison and chart of `state` (None: the current deployment, first reading the base): drawn
        at once where predicted already, else by the worker; the worker then predicts the neighbours ahead (started
        after the repaint where the comparison was drawn here, so its Python does not slow the frame)."""
        self.seq += 1
        shown = state is not None and self._show_kept(self.seq, state)
        with self._lock:
            self._wanted = (self.seq, state, self.axis)
            if self._busy:
                return
            self._busy = True
        if shown:
            self.call_after_refresh(self._predict)
        else:
            if state is not None:
                self.query_one(WhatIfCompare).pending = state.label
            self._predict()

    def _show_kept(self, seq: int, state: KnobState) -> bool:
        """Draw the comparison (and the chart) of `state` on the event loop where its figures are kept: a lookup
        and a redraw, no thread to wait for. False where it must be predicted."""
        predictor = self.predictor
        if predictor is None or not predictor.is_kept(state.turned):
            return False
        self._predicted(WhatIfPredicted(seq, state, whatif_view(predictor, state)))
        chart = chart_axis(self.axis, state)
        points = axis_points(chart, state)
        if all(predictor.is_kept(p) for p in points):
            self._charted(WhatIfCharted(seq, axis_series(chart, state, predictor.along(points), self.target_tps)))
        return True

    @work(thread=True, exit_on_error=False, group="whatif")
    def _predict(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a scenario the composition cannot handle: say so, keep the screen
            self.post_message(
                WhatIfPredicted(self.seq, self.state or KnobState({}), None, f"{type(exc).__name__}: {exc}")
            )
        finally:
            with self._lock:
                self._busy = False

    def _serve(self) -> None:
        """Answer the newest state asked for until no newer one waits; then predict the neighbours ahead."""
        done = -1
        while True:
            with self._lock:
                seq, state, axis = self._wanted
                if seq == done:
                    self._busy = False
                    break
            predictor = self._predictor()
            if state is None:
                scenario = predictor.now.scenario
                assert scenario is not None  # the current deployment is always one
                state = KnobState(current_values(scenario))
            if seq > self.shown_seq:  # not drawn from what was kept already
                self.post_message(WhatIfPredicted(seq, state, whatif_view(predictor, state)))
            if seq > self.charted_seq:
                chart = chart_axis(axis, state)
                variants = predictor.along(axis_points(chart, state))
                self.post_message(WhatIfCharted(seq, axis_series(chart, state, variants, self.target_tps)))
            done = seq
            self._ahead(predictor, state, seq)

    def _predictor(self) -> WhatIfPredictor:
        if self.predictor is None:
            self.predictor = WhatIfPredictor(self._base())
        return self.predictor

    def _ahead(self, predictor: WhatIfPredictor, state: KnobState, seq: int) -> None:
        """Predict each knob's neighbours of `state`, stopping at once when a newer key press waits."""
        for knob in KNOB_TABLE:
            for direction in (-1, 1):
                with self._lock:
                    if self._wanted[0] != seq:
                        return
                predictor.variant(state.step(knob.name, direction).turned)

    # -- results -------------------------------------------------------------------------------------------------

    @on(WhatIfPredicted)
    def _predicted(self, message: WhatIfPredicted) -> None:
        if message.view is None:
            self.query_one("#whatif-lines", Static).update(f"what-if not predicted: {message.problem}")
            self.shown_seq = self.charted_seq = self.drawn_seq = message.seq
            self.query_one(WhatIfCompare).pending = ""
            return
        if message.seq < self.shown_seq:
            return
        if self.state is None:
            self.state = message.state
            self.query_one(WhatIfKnobs).state = message.state
        self.shown_seq = message.seq
        self.view = message.view
        if message.seq == self.seq:
            self.query_one(WhatIfCompare).pending = ""
        self.query_one("#whatif-title", Static).update(message.view.title)
        self._show_lines()
        self.query_one(WhatIfCompare).view = message.view

    @on(WhatIfCharted)
    def _charted(self, message: WhatIfCharted) -> None:
        """The chart's new series, drawn after the comparison's repaint: plotext takes tens of ms to draw, the bar
        and its figures come first."""
        if message.seq < self.charted_seq:
            return
        self.charted_seq = message.seq
        self.series = message.series
        self.call_after_refresh(self._draw_chart, message.seq, message.series)

    def _draw_chart(self, seq: int, series: AxisSeries) -> None:
        if seq != self.charted_seq:
            return  # a newer series came meanwhile
        self.query_one(WhatIfChart).show(series)
        self.query_one("#whatif-notes", Static).update("; ".join(series.notes))
        self.drawn_seq = seq


def open_whatif(budget: BudgetSource, settings: Settings, results: Mapping[str, object], now_s: float) -> WhatIfScreen:
    """The what-if screen over what the budget composes for `settings` from `results` now (a copy: probe results
    that arrive later do not move it)."""
    return WhatIfScreen(lambda: budget.context(settings, results, now_s), settings.target_tps)
