"""Provides TracedBar: under the probed budget bar, the engine's own step from a profiler trace, component by
component in the same colours and order ("should cost / does cost"), plus what probes cannot have (GPU idle inside
the step, copies & casts, unattributed kernels), the largest gap in words, every rank's step, and the trace's path
and age. Enter on a segment opens its kernels.

It loads `--trace` and captures from `--server` itself, in thread workers: the blocking read or capture runs on a
daemon thread the worker watches, so neither a slow server nor a 1 GB trace holds up the screen or quitting.
Outcomes and progress go to the app as `TraceStatus` (one line for the status bar).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.worker import get_current_worker

from decodetop.budget.components import Component
from decodetop.budget.scenario import ModelSource
from decodetop.errors import UserInputError
from decodetop.history import format_age_coarse
from decodetop.inert import inert, inert_data
from decodetop.themes.palette import segment_variable
from decodetop.traces.compare import figure_source, short_name
from decodetop.traces.trace_report import LAUNCH_KEY
from decodetop.traces.traced import COPIES_KEY, OTHER_KEY, TracedSegment, TracedView, traced_view
from decodetop.tui.model import BudgetView
from decodetop.tui.trace_source import TraceLoad, TraceOptions, capture_and_load, layers_of, load, mismatch_of
from decodetop.tui.widgets import tiers
from decodetop.tui.widgets.budget_bar import SHORT_LABELS as BUDGET_SHORT_LABELS
from decodetop.tui.widgets.budget_bar import short_ms_text
from decodetop.tui.widgets.tiers import TieredLines

T = TypeVar("T")

COMPACT_BELOW_ROWS = 40
"""Terminals shorter than this get three lines (header, bar, largest gap): the app's compact budget legend's bound."""
SHORT_LABELS = {**BUDGET_SHORT_LABELS, LAUNCH_KEY: "idle (host)", COPIES_KEY: "copies/casts", OTHER_KEY: "unattributed"}
"""The probed bar's short labels, and the traced bar's own segments'."""
GAP_LINES = {True: 1, False: 2}
"""Lines the largest gap may take: compact, full."""
LABEL_WIDTH = 11
"""Width of the label before the bar: the probed bar's (BudgetBar draws its bars after 11 columns)."""
ENTRY_WIDTH = 30
"""Characters per legend entry: glyph, label, should/does ms."""
COMPACT_ENTRY_WIDTH = 26
WATCH_S = 0.1
"""How often a worker looks at its cancel flag while the daemon thread reads or captures."""
_COMPONENT_KEYS = tuple(c.value for c in Component)
_SEG_CLASSES = {key: f"traced-bar--{segment_variable(key)}" for key in _COMPONENT_KEYS}
_SEG_CLASSES[COPIES_KEY] = "traced-bar--copies"
_SEG_CLASSES[OTHER_KEY] = "traced-bar--other"
_GLYPHS = {COPIES_KEY: "▚", OTHER_KEY: "░"}
"""Segments probes cannot have get their own fill, so they read apart from the components without a legend."""


def _css() -> str:
    rules = [
        "TracedBar { height: auto; padding: 0 1; }",
        "TracedBar:focus { background: $boost; }",
        "TracedBar > .traced-bar--title { text-style: bold; }",
        "TracedBar > .traced-bar--muted { color: $state-muted; }",
        "TracedBar > .traced-bar--gap { color: $state-warn; }",
        "TracedBar > .traced-bar--mismatch { color: $state-bad; text-style: bold; }",
        "TracedBar > .traced-bar--copies { color: $state-warn; }",
        "TracedBar > .traced-bar--other { color: $seg-unexplained; }",
        "TracedBar > .traced-bar--selected { text-style: reverse; }",
    ]
    rules += [f"TracedBar > .{_SEG_CLASSES[key]} {{ color: ${segment_variable(key)}; }}" for key in _COMPONENT_KEYS]
    return "\n".join(dict.fromkeys(rules))


@dataclass
class TraceStatus(Message):
    """One line for the status bar: progress, or how a load or capture ended."""

    text: str


@dataclass
class TraceLoaded(Message):
    """A trace was read (or failed: `load` None, `problem` one line)."""

    load: TraceLoad | None
    problem: str = ""


@dataclass
class TraceRechecked(Message):
    """The loaded trace checked again against the session's new model or TP (`checked` replaces `was`)."""

    was: TraceLoad
    checked: TraceLoad


@dataclass
class OpenTraceKernels(Message):
    """Enter on a segment: show its kernels."""

    segment: TracedSegment
    trace_path: str


def _watched(run: Callable[[Callable[[], bool]], T]) -> T | None:
    """Run `run(cancelled)` on a daemon thread and wait for it from the calling worker; None once the worker is
    cancelled (the daemon thread is left to finish or time out on its own, so quitting never waits for it)."""
    worker = get_current_worker()
    done = threading.Event()
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = run(lambda: worker.is_cancelled)
        except BaseException as exc:  # handed to the worker, which turns it into one status line
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=body, name="decodetop-trace", daemon=True).start()
    while not done.wait(WATCH_S):
        if worker.is_cancelled:
            return None
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


class TracedBar(Widget, can_focus=True):
    """The traced bar under the probed one.

    | Class | Description |
    | :- | :- |
    | `traced-bar--seg-<component>` | A component's colour (the probed bar's theme variable). |
    | `traced-bar--copies` / `--other` | Copies & casts / unattributed kernels. |
    | `traced-bar--gap` | The largest gap line. |
    | `traced-bar--mismatch` | What the trace shows that the model or TP does not have. |
    | `traced-bar--selected` | The segment Enter opens. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "traced-bar--title",
        "traced-bar--muted",
        "traced-bar--gap",
        "traced-bar--mismatch",
        "traced-bar--selected",
        *_SEG_CLASSES.values(),
    }
    DEFAULT_CSS = _css()
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "select(-1)", "previous segment", show=False),
        Binding("right", "select(1)", "next segment", show=False),
        Binding("enter", "open", "kernels", show=False),
    ]

    load: reactive[TraceLoad | None] = reactive(None, layout=True)
    budget: reactive[BudgetView | None] = reactive(None, layout=True)
    compact: reactive[bool] = reactive(False, layout=True)
    now_s: reactive[float] = reactive(0.0)
    selected: reactive[int] = reactive(0)
    max_lines: reactive[int | None] = reactive(None, layout=True)
    """The rows the layout gives the bar (None: as many as it has; 0: none, as when the budget box is folded)."""

    def __init__(self, options: TraceOptions | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.options = options or TraceOptions()
        self.busy = False
        """True while a load or capture runs (a second press is refused with a status line)."""
        self._view_cache: tuple[object, object, TracedView | None] = (None, None, None)

    def on_mount(self) -> None:
        """Hidden until a trace is loading or loaded: no room is taken on screens without one."""
        self.display = self.options.path is not None

    # -- data ------------------------------------------------------------------------------------------------------

    @property
    def view(self) -> TracedView | None:
        """The traced bar of the loaded trace beside the current budget (None before a trace)."""
        load, budget = self.load, self.budget
        if load is None:
            return None
        if self._view_cache[0] is load and self._view_cache[1] is budget:
            return self._view_cache[2]
        probed: Mapping[str, float | None] | None = None
        sources: dict[str, str] | None = None
        observed = None
        if budget is not None:
            probed = {s.key: s.ms for s in budget.components if s.status != "missing"}
            sources = {s.key: figure_source(s.status, s.provenance_kind, stored=False) for s in budget.components}
            observed = budget.observed_ms
        from_trace = budget is not None and budget.observed_source == "trace"
        view = traced_view(
            load.traces,
            probed,
            observed_ms=observed,
            layers=load.layers,
            observed_is_trace=from_trace,
            sources=sources,
            mismatch=load.mismatch,
        )
        view = inert_data(view)  # kernel and module names, the path: the trace's text, never a control sequence
        self._view_cache = (load, budget, view)
        return view

    def start(self, model: ModelSource | str | None = None, tp: int | None = None) -> None:
        """Load --trace, if one was given (called once the app is mounted), checked against `model` (the settings'
        preset or config) at `tp`."""
        if self.options.path is not None:
            self._begin(f"trace: reading {self.options.path}…")
            self._load_worker(model, tp)

    def capture(self, scenario: Mapping[str, object]) -> None:
        """Capture N steps from --server in the background (the capture key)."""
        if self.busy:
            self.post_message(TraceStatus("trace: a capture or load is already running"))
            return
        if not self.options.server:
            self.post_message(TraceStatus("trace: capture needs --server URL (a SGLang or vLLM server)"))
            return
        self._begin(f"trace: capturing {self.options.steps} steps from {self.options.server}…")
        self._capture_worker(dict(scenario))

    def _begin(self, text: str) -> None:
        self.busy = True
        self.display = True
        self.post_message(TraceStatus(text))

    @work(thread=True, exit_on_error=False, group="trace", exclusive=True)
    def _load_worker(self, model: ModelSource | str | None, tp: int | None) -> None:
        path = self.options.path
        assert path is not None
        try:
            got = _watched(lambda _cancelled: load(path, self.options, model=model, tp=tp))
        except UserInputError as exc:
            self.post_message(TraceLoaded(None, str(exc)))
            return
        except Exception as exc:  # an unexpected failure is one line too; the UI keeps running
            self.post_message(TraceLoaded(None, f"trace: {type(exc).__name__}: {exc}"))
            return
        if got is not None:
            self.post_message(TraceLoaded(got))

    @work(thread=True, exit_on_error=False, group="trace", exclusive=True)
    def _capture_worker(self, scenario: dict[str, object]) -> None:
        def run(cancelled: Callable[[], bool]) -> TraceLoad:
            import time

            def sleep(seconds: float) -> None:
                if cancelled():
                    raise UserInputError("trace: capture cancelled")
                time.sleep(seconds)

            def progress(text: str) -> None:
                self.post_message(TraceStatus(text))

            return capture_and_load(self.options, scenario, progress=progress, sleep=sleep)

        try:
            got = _watched(run)
        except UserInputError as exc:
            self.post_message(TraceLoaded(None, str(exc)))
            return
        except Exception as exc:
            self.post_message(TraceLoaded(None, f"trace: {type(exc).__name__}: {exc}"))
            return
        if got is not None:
            self.post_message(TraceLoaded(got))

    def recheck(self, model: ModelSource | str | None, tp: int | None) -> None:
        """Check the loaded trace again against a new model or TP of the session (`m`, `p`): its mismatch line and
        'per layer' follow the scenario the budget beside it is composed for."""
        if self.load is not None:
            self._recheck_worker(self.load, model, tp)

    @work(thread=True, exit_on_error=False, group="trace-check", exclusive=True)
    def _recheck_worker(self, was: TraceLoad, model: ModelSource | str | None, tp: int | None) -> None:
        checked = replace(was, layers=layers_of(model), mismatch=mismatch_of(was.traces, model, tp))
        self.post_message(TraceRechecked(was, checked))

    @on(TraceRechecked)
    def _rechecked(self, message: TraceRechecked) -> None:
        message.stop()
        if self.load is message.was:  # a newer load or capture wins
            self.load = message.checked

    @on(TraceLoaded)
    def _loaded(self, message: TraceLoaded) -> None:
        # not stopped: the app hands the trace's steps to the budget (an observation of the engine's step)
        self.busy = False
        if message.load is None:
            self.display = self.load is not None
            self.post_message(TraceStatus(message.problem))
            return
        self.load = message.load
        self.selected = 0
        view = self.view
        if view is not None and view.gap_key is not None:
            keys = [s.key for s in view.segments]
            self.selected = keys.index(view.gap_key) if view.gap_key in keys else 0
        self.post_message(TraceStatus(f"trace: {message.load.path.name} ({message.load.origin})"))

    # -- keys ------------------------------------------------------------------------------------------------------

    def action_select(self, step: int) -> None:
        """Move the segment selection."""
        view = self.view
        if view is not None and view.segments:
            self.selected = (self.selected + step) % len(view.segments)

    def action_open(self) -> None:
        """Open the selected segment's kernels."""
        view = self.view
        if view is None or not view.segments:
            return
        segment = view.segments[min(self.selected, len(view.segments) - 1)]
        self.post_message(OpenTraceKernels(segment, view.path))

    # -- drawing ---------------------------------------------------------------------------------------------------

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """Lines `render` produces at `width`."""
        return len(self._lines(max(20, width)))

    def render(self) -> Text:
        """The whole panel as one Text."""
        return Text("\n").join(self._lines(max(20, self.content_region.width or self.size.width)))

    def _scale(self, view: TracedView) -> float:
        budget = self.budget
        scale = view.step_ms
        if budget is not None:  # the probed bar's full scale, so the two bars line up
            scale = max(scale, budget.observed_ms, budget.explained_ms, budget.target_ms, budget.roofline_ms or 0.0)
        return scale if scale > 0 else 1.0

    def _lines(self, width: int) -> list[Text]:
        """The lines that fit the rows given, lowest tiers first, in display order."""
        return tiers.keep_lines(self.tiered_lines(width), self.max_lines, self._style("traced-bar--muted"))

    def tiered_lines(self, width: int) -> TieredLines:
        """Every line the bar has at `width`, each with its tier (`tui.widgets.tiers`), in display order."""
        view, loaded = self.view, self.load
        if view is None or loaded is None:
            note = Text("no trace: press c to capture from --server, or start with --trace FILE", style="dim")
            note.truncate(width, overflow="ellipsis")
            return [(tiers.TRACE_BAR, note)]
        compact = self.compact or self.app.size.height < COMPACT_BELOW_ROWS
        title = Text()
        title.append(view.header(), style=self._style("traced-bar--title"))
        age = format_age_coarse(max(0.0, self.now_s - loaded.modified_s)) if self.now_s else ""
        where = f" · {inert(loaded.path.name)}" + (f" ({age} old)" if age else "")
        title.append(where, style=self._style("traced-bar--muted"))
        if not compact:
            title.append(f" · legend: {view.budget_source}/traced ms", style=self._style("traced-bar--muted"))
        title.truncate(width, overflow="ellipsis")
        lines: TieredLines = [(tiers.TRACE_GAP, title)]
        if view.mismatch:  # the one line that says the trace is not of this model or deployment
            mismatch = Text(view.mismatch, style=self._style("traced-bar--mismatch"))
            lines.extend(
                (tiers.TRACE_GAP, line) for line in mismatch.wrap(self.app.console, width)[: GAP_LINES[compact]]
            )
        lines.append((tiers.TRACE_BAR, self._bar_line(view, width)))
        gap = Text(f"largest gap: {view.gap_text}" if view.gap_text else "", style=self._style("traced-bar--gap"))
        if not compact:
            lines.extend((tiers.TRACE_DETAIL, line) for line in self._legend(view, width))
        if view.gap_text:
            wrapped = list(gap.wrap(self.app.console, width))
            if len(wrapped) > GAP_LINES[compact]:
                wrapped = wrapped[: GAP_LINES[compact]]
                wrapped[-1].truncate(width - 1)
                wrapped[-1].append("…")
            lines.extend((tiers.TRACE_GAP, line) for line in wrapped)
        if view.ranks_text:
            ranks = Text(view.ranks_text, style=self._style("traced-bar--muted"))
            ranks.truncate(width, overflow="ellipsis")
            lines.append((tiers.TRACE_DETAIL, ranks))
        if not compact:
            how = Text(view.attribution_text, style=self._style("traced-bar--muted"))
            how.truncate(width, overflow="ellipsis")
            lines.append((tiers.TRACE_DETAIL, how))
        return lines

    def _bar_line(self, view: TracedView, width: int) -> Text:
        bar_width = max(10, width - LABEL_WIDTH)
        scale = self._scale(view)
        cells: list[tuple[str, str]] = [(" ", "")] * bar_width
        position = 0.0
        for index, seg in enumerate(view.segments):
            if seg.traced_ms <= 0:
                continue
            first = round(position / scale * bar_width)
            position += seg.traced_ms
            last = max(first + 1, round(position / scale * bar_width))
            glyph = _GLYPHS.get(seg.key, "█")
            cls = _SEG_CLASSES.get(seg.key, "traced-bar--other")
            if index == self.selected and self.has_focus:
                cls = "traced-bar--selected"
            for i in range(max(0, first), min(bar_width, last)):
                cells[i] = (glyph, cls)
        text = Text("traced".rjust(LABEL_WIDTH - 1) + " ", style=self._style("traced-bar--muted"))
        for char, cls in cells:
            text.append(char, style=self._style(cls) if cls else "")
        return text

    def _legend(self, view: TracedView, width: int) -> list[Text]:
        entry = COMPACT_ENTRY_WIDTH if width < 100 else ENTRY_WIDTH
        columns = max(1, width // entry)
        segs = list(enumerate(view.segments))
        rows = math.ceil(len(segs) / columns)
        out: list[Text] = []
        for row in range(rows):
            line = Text()
            for col in range(columns):
                k = col * rows + row
                if k >= len(segs):
                    break
                index, seg = segs[k]
                line.append_text(self._entry(index, seg, entry))
            line.rstrip()
            out.append(line)
        return out

    def _entry(self, index: int, seg: TracedSegment, width: int) -> Text:
        cls = _SEG_CLASSES.get(seg.key, "traced-bar--other")
        text = Text()
        text.append(_GLYPHS.get(seg.key, "█"), style=self._style(cls))
        label = SHORT_LABELS.get(seg.key) or short_name(seg.label, 14)
        probed = "–" if seg.probed_ms is None else short_ms_text(seg.probed_ms)
        figures = f"{probed}/{short_ms_text(seg.traced_ms)}"  # probed/traced, each with its unit
        body = f" {label[: width - len(figures) - 3]:<{width - len(figures) - 3}}{figures} "
        selected = index == self.selected and self.has_focus
        text.append(body, style=self._style("traced-bar--selected") if selected else "")
        return text

    def on_focus(self) -> None:
        """Show the selection."""
        self.refresh()

    def on_blur(self) -> None:
        """Hide the selection."""
        self.refresh()

    def watch_selected(self) -> None:
        """Redraw the selection."""
        self.refresh()
