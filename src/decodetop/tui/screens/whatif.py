"""Provides WhatIfScreen (`w`): the current deployment beside a variant of it, predicted from the curves of the
results the budget composes from (`decodetop.pipeline.whatif.predict`, the one composition: no probe runs from
here), each knob turned by a key, and a chart of tok/s over one knob.

Work is off the event loop, in the order a reader needs it: a key's worker predicts the newest knob state's variant
alone (key presses faster than a prediction coalesce into the last one) and posts `WhatIfPredicted`; once that
comparison is drawn, a follow-up worker predicts the chart's points (`WhatIfCharted`), and once the chart is drawn,
every knob's neighbours, so the next key press finds its variant kept and the bar re-composes at once. A follow-up
stops between two predictions as soon as a newer key came, so it never holds the cores from that key's own
prediction for longer than one point. The screen is modal: the main screen's probe keys (r, R) do not reach through
it; escape or w returns to it.
"""

from __future__ import annotations

import contextlib
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
from textual.worker import get_current_worker

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
    """The chart's series for knob state number `seq` (or why it could not be predicted)."""

    seq: int
    state: KnobState
    series: AxisSeries | None
    problem: str = ""


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
        """The knob state whose comparison is drawn."""
        self.drawn_seq = -1
        """The knob state whose chart is drawn (predicted after its comparison was drawn)."""
        self.ahead_seq = -1
        """The knob state whose neighbours are all predicted."""
        self._wanted: tuple[int, KnobState | None] = (0, None)
        """The newest state the key's worker is asked for (None: the current deployment, still to be read)."""
        self._lock = threading.Lock()
        self._busy = False
        """The key's worker runs (it takes `_wanted` again before it ends)."""
        self._threads = 0
        """Follow-up threads running, a superseded one included until it has finished the point it was at."""
        self._title = ""
        self._lines_shown: Text | None = None

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
        if text != self._lines_shown:  # the same lines for every variant: no re-layout per key press
            self._lines_shown = text
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

    @property
    def idle(self) -> bool:
        """True when settled, the neighbours of the newest state are predicted and no worker thread is left (the
        knob-change benchmark waits on it before a key it times)."""
        with self._lock:
            quiet = not self._busy and self._threads == 0
        return quiet and self.settled and self.ahead_seq == self.seq

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

    # -- the workers ---------------------------------------------------------------------------------------------

    def _ask(self, state: KnobState | None) -> None:
        """Ask for the comparison of `state` (None: the current deployment, first reading the base): drawn at once
        where its variant is kept, else predicted alone by the key's worker. The chart's points and the neighbours
        ahead follow in their own worker once the comparison is drawn (`_follow_up`)."""
        self.seq += 1
        if state is not None and self._show_kept(self.seq, state):
            return
        if state is not None:
            self.query_one(WhatIfCompare).pending = state.label
        with self._lock:
            self._wanted = (self.seq, state)
            if self._busy:
                return  # the running worker takes the newest state when its prediction is done
            self._busy = True
        self._predict()

    def _show_kept(self, seq: int, state: KnobState) -> bool:
        """Draw the comparison of `state` on the event loop where its variant is kept: a lookup and a redraw, no
        thread to wait for. False where it must be predicted."""
        predictor = self.predictor
        variant = predictor.kept(state.turned) if predictor is not None else None
        if predictor is None or variant is None:
            return False
        self._predicted(WhatIfPredicted(seq, state, whatif_view(predictor, variant)))
        return True

    @work(thread=True, exit_on_error=False, group="whatif")
    def _predict(self) -> None:
        """The key's worker: the newest state's variant alone, one prediction, posted at once; again while keys
        pressed meanwhile wait."""
        with self._lock:
            seq, state = self._wanted
        try:
            while True:
                predictor = self._predictor()
                if state is None:
                    scenario = predictor.now.scenario
                    assert scenario is not None  # the current deployment is always one
                    state = KnobState(current_values(scenario))
                variant = predictor.variant(state.turned)
                self.post_message(WhatIfPredicted(seq, state, whatif_view(predictor, variant)))
                with self._lock:
                    if self._wanted[0] == seq:
                        self._busy = False
                        return
                    seq, state = self._wanted
        except Exception as exc:  # a scenario the composition cannot handle: say so, keep the screen
            self.post_message(WhatIfPredicted(seq, state or KnobState({}), None, f"{type(exc).__name__}: {exc}"))
            with self._lock:
                self._busy = False

    def _predictor(self) -> WhatIfPredictor:
        if self.predictor is None:
            self.predictor = WhatIfPredictor(self._base())
        return self.predictor

    def _follow_up(self, seq: int, state: KnobState) -> None:
        """After the comparison of `seq` is drawn: its chart's points, unless a newer key came meanwhile."""
        if seq == self.seq:
            self._chart(seq, state, self.axis)

    def _stale(self, seq: int) -> bool:
        """Whether a follow-up of knob state `seq` should stop: a newer key came (its own prediction goes first) or
        a newer follow-up replaced this one."""
        return seq != self.seq or get_current_worker().is_cancelled

    @work(thread=True, exit_on_error=False, group="whatif-follow", exclusive=True)
    def _chart(self, seq: int, state: KnobState, axis_name: str) -> None:
        """The chart's points along `axis_name`, one prediction at a time, dropped between two points as soon as
        a newer key came; the series is posted when they are all predicted."""
        with self._lock:
            self._threads += 1
        try:
            predictor = self._predictor()
            axis = chart_axis(axis_name, state)
            variants = []
            for point in axis_points(axis, state):
                if self._stale(seq):
                    return
                variants.append(predictor.variant(point))
            self.post_message(WhatIfCharted(seq, state, axis_series(axis, state, variants, self.target_tps)))
        except Exception as exc:  # a point the composition cannot handle: the comparison stays, the chart says why
            self.post_message(WhatIfCharted(seq, state, None, f"chart not predicted: {type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self._threads -= 1

    @work(thread=True, exit_on_error=False, group="whatif-follow", exclusive=True)
    def _look_ahead(self, seq: int, state: KnobState) -> None:
        """After the chart of `seq` is drawn: every knob's neighbours, so the next key press finds its variant."""
        with self._lock:
            self._threads += 1
        try:
            with contextlib.suppress(Exception):  # a neighbour the composition cannot handle: its key press says why
                self._ahead(self._predictor(), state, seq)
            if not self._stale(seq):
                self.ahead_seq = seq
        finally:
            with self._lock:
                self._threads -= 1

    def _ahead(self, predictor: WhatIfPredictor, state: KnobState, seq: int) -> None:
        """Predict each knob's neighbours of `state`, stopping at once when a newer key press waits."""
        for knob in KNOB_TABLE:
            for direction in (-1, 1):
                if self._stale(seq):
                    return
                predictor.variant(state.step(knob.name, direction).turned)

    # -- results -------------------------------------------------------------------------------------------------

    @on(WhatIfPredicted)
    def _predicted(self, message: WhatIfPredicted) -> None:
        """The comparison of `message.seq` drawn (where no newer one is), then its chart asked for after the
        repaint: the bar and its figures come first."""
        compare = self.query_one(WhatIfCompare)
        if message.view is None:
            self.query_one("#whatif-lines", Static).update(f"what-if not predicted: {message.problem}")
            self._lines_shown = None
            self.shown_seq = self.drawn_seq = self.ahead_seq = message.seq
            compare.pending = ""
            return
        if message.seq < self.shown_seq:
            return
        if self.state is None:
            self.state = message.state
            self.query_one(WhatIfKnobs).state = message.state
        self.shown_seq = message.seq
        self.view = message.view
        if message.seq == self.seq:
            compare.pending = ""
            self.call_after_refresh(self._follow_up, message.seq, message.state)
        if message.view.title != self._title:
            self._title = message.view.title
            self.query_one("#whatif-title", Static).update(message.view.title)
        self._show_lines()
        compare.view = message.view

    @on(WhatIfCharted)
    def _charted(self, message: WhatIfCharted) -> None:
        """The chart of the newest key press drawn (an older one's is dropped: the newest comes after it), then
        the neighbours predicted ahead after its repaint."""
        if message.seq != self.seq:
            return
        if message.series is not None:
            self.series = message.series
            self.query_one(WhatIfChart).show(message.series)
        self.query_one("#whatif-notes", Static).update(
            "; ".join(message.series.notes) if message.series is not None else message.problem
        )
        self.drawn_seq = message.seq
        self.call_after_refresh(self._start_ahead, message.seq, message.state)

    def _start_ahead(self, seq: int, state: KnobState) -> None:
        if seq == self.seq:
            self._look_ahead(seq, state)


def open_whatif(budget: BudgetSource, settings: Settings, results: Mapping[str, object], now_s: float) -> WhatIfScreen:
    """The what-if screen over what the budget composes for `settings` from `results` now (a copy: probe results
    that arrive later do not move it)."""
    return WhatIfScreen(lambda: budget.context(settings, results, now_s), settings.target_tps)
