"""Provides BudgetBar: the stacked per-token latency bar, a zoomed bar, markers and a legend with ms, % and age.

The full bar spans 0 to the largest of observed, explained, target and roofline, so the unexplained remainder
(hatched) is seen against the observed step. A step of 95 ms next to a 3 ms target leaves the target a single
cell wide, so a second bar zooms to 0 .. ~1.2 × max(explained, target, roofline): the components, the target and
the roofline all read at 80 columns. Every colour comes from a component class whose CSS names a theme variable.
A component that moved beyond its noise since the baseline shows "Δ" and its signed change in place of its share.

Measured and estimated read apart in the bar itself: a roofline estimate is drawn hatched (its pattern on every
other cell, "·" between, dimmed), so also without colour; it keeps its "≈" in the legend and never shows a Δ (an
estimate moves with its assumptions, not with the host). Above the bar: the header that must not be missed (CPU
ranks, an unreachable server), the observed step marked "assumed, not observed" when it is the default, and the
roofline verdict in the CLI's words.

Every line has a priority tier (`tui.widgets.tiers`): given fewer rows (`max_lines`, from the app's layout) the bar
keeps the one-line verdict, then the bar, then the legend, then the rest; folded (`folded`) it is the verdict alone.
Every number carries its unit ("1.20ms", "0–95.0ms", "Δ+0.61ms"), and every cut ends in an ellipsis.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from dataclasses import dataclass
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from decodetop.budget.remainder import EXCEEDS_OBSERVED
from decodetop.history import format_age_coarse
from decodetop.textfmt import format_ms as format_duration
from decodetop.textfmt import format_number
from decodetop.themes.palette import SEGMENT_KEYS, segment_pattern, segment_variable
from decodetop.tui.model import BudgetSegment, BudgetView
from decodetop.tui.widgets import tiers
from decodetop.tui.widgets.tiers import TieredLines

STALE_AFTER_S = 600.0
"""Values older than this (10 min) are drawn muted: the host may have changed since."""
ZOOM_HEADROOM = 1.2
"""The zoomed bar spans this much beyond the largest of explained, target and roofline."""
ZOOM_WORTH_IT = 3.0
"""Draw the zoomed bar only when the full scale is at least this many times the zoomed one."""
LEGEND_ENTRY_WIDTH = 38
"""The narrowest legend entry (glyph, a 14-character label, ms, %, age and a gap): how many columns the legend has
(two at 80, three at 120, five at 200). The labels then take all the room the columns leave."""
COMPACT_ENTRY_WIDTH = 25
"""The narrowest compact legend entry (glyph, a 10-character label, ms, %, a gap): three columns fit at 80."""
COMPACT_LABEL_WIDTH = 11
STATUS_MARKS = {"interpolated": "~", "estimated": "≈"}
"""Legend marks: "~" interpolated between measured points, "≈" a roofline estimate (not measured)."""
SHORT_LABELS = {
    "attention": "attention",
    "attention_proj": "attn proj",
    "dense_mlp": "dense MLP",
    "routed_experts": "experts",
    "shared_experts": "shared exp",
    "routing": "routing",
    "communication": "all-reduce",
    "norms": "norms",
    "lm_head": "lm_head",
    "launch": "launch",
    "unexplained": "unexplained",
    "over_observed": "over obs.",
}
"""Labels of at most COMPACT_LABEL_WIDTH characters: what a legend column too narrow for the whole label shows (a word
the reader knows, not a cut one)."""
UNEXPLAINED_GLYPH = "░"
MAX_SHARE_PCT = 999.5
"""Shares of the observed step above this print as ">999%" (">1k%" in the compact legend): CPU ranks' parts can
be thousands of times the step, and the column keeps its width."""
ESTIMATE_GAP = "·"
"""Every other cell of a roofline estimate: the hatching that tells an estimate from a measurement without colour."""
_ESTIMATE = "|estimate"
"""Suffix of a cell's class: drawn dimmed (an estimate)."""

_SEGMENT_CLASSES = {key: f"budget-bar--{segment_variable(key)}" for key in SEGMENT_KEYS}
_MARK_CLASSES = ("budget-bar--mark-observed", "budget-bar--mark-target", "budget-bar--mark-roofline")
_MOVED_CLASSES = ("budget-bar--moved-up", "budget-bar--moved-down")


def _css() -> str:
    rules = [
        "BudgetBar { height: auto; padding: 0 1; }",
        "BudgetBar > .budget-bar--title { text-style: bold; }",
        "BudgetBar > .budget-bar--muted { color: $state-muted; }",
        "BudgetBar > .budget-bar--missing { color: $state-muted; text-style: italic; }",
        "BudgetBar > .budget-bar--header { color: $state-warn; text-style: bold; }",
        "BudgetBar > .budget-bar--warning { color: $state-bad; text-style: bold; }",
        "BudgetBar > .budget-bar--assumed { color: $state-warn; text-style: bold; }",
        "BudgetBar > .budget-bar--moved-up { color: $state-bad; text-style: bold; }",
        "BudgetBar > .budget-bar--moved-down { color: $state-ok; text-style: bold; }",
    ]
    rules += [f"BudgetBar > .{cls} {{ color: ${segment_variable(key)}; }}" for key, cls in _SEGMENT_CLASSES.items()]
    rules += [
        f"BudgetBar > .{cls} {{ color: ${cls.removeprefix('budget-bar--')}; text-style: bold; }}"
        for cls in _MARK_CLASSES
    ]
    return "\n".join(rules)


@dataclass(frozen=True)
class _Marker:
    position_ms: float
    glyph: str
    label: str
    style_class: str


def format_ms(value_ms: float) -> str:
    """Milliseconds with three significant figures ("0.412", "3.24", "95.0", "112")."""
    if value_ms <= 0:
        return "0"
    if value_ms >= 100:
        return f"{value_ms:.0f}"
    decimals = max(0, 2 - math.floor(math.log10(value_ms)))
    return f"{value_ms:.{min(decimals, 3)}f}"


def format_delta_ms(delta_ms: float, compact: bool = False) -> str:
    """A signed change: "Δ+0.612 ms" ("Δ+0.61ms" compact: two decimals at most, the unit kept)."""
    sign = "-" if delta_ms < 0 else "+"
    size = abs(delta_ms)
    if not compact:
        return f"Δ{sign}{format_duration(size)}"
    if size >= 1000:
        return f"Δ{sign}{format_duration(size, space=False)}"
    if size >= 100:
        return f"Δ{sign}{size:.0f}ms"
    return f"Δ{sign}{size:.1f}ms" if size >= 10 else f"Δ{sign}{size:.2f}ms"


def ms_text(value_ms: float) -> str:
    """A figure of the budget box with its unit, compact: "1.20ms", "0.412ms", "9.30µs", "12.4s"."""
    return format_duration(value_ms, space=False)


def short_ms_text(value_ms: float) -> str:
    """A figure of the compact legend, six cells at most below 1000 ms: "1.20ms", "0.41ms", "79.0ms", "112ms",
    "24.0µs" (below 0.1 ms), "12.4s"."""
    size = abs(value_ms)
    if 0 < size < 0.1:
        return f"{format_number(value_ms * 1000)}µs"
    if size >= 1000:
        return ms_text(value_ms)
    if size >= 100:
        return f"{value_ms:.0f}ms"
    return f"{value_ms:.1f}ms" if size >= 10 else f"{value_ms:.2f}ms"


LEGEND_GAP = 2
"""Cells between two legend columns."""
COMPACT_GAP = 1
"""Cells between two compact legend columns (three columns at 80 keep the short labels whole)."""


@dataclass(frozen=True)
class LegendEntry:
    """One legend entry in its parts, drawn each after a space: glyph, label, figure (right-aligned) and tail (the
    unit, share and age; or the change since the baseline)."""

    segment: BudgetSegment
    glyph: Text
    value: Text
    tail: Text


@dataclass(frozen=True)
class LegendColumn:
    """The widths, in cells, of one legend column's label, figure and tail, and the gap after it."""

    label_cells: int
    value_cells: int
    tail_cells: int
    gap_cells: int

    @property
    def cells(self) -> int:
        """The column's whole width: glyph, label, figure and tail each after a space, then the gap."""
        return 1 + 1 + self.label_cells + 1 + self.value_cells + 1 + self.tail_cells + self.gap_cells


def short_label(segment: BudgetSegment) -> str:
    """The shorter of the segment's label and its SHORT_LABELS form."""
    short = SHORT_LABELS.get(segment.key, segment.label)
    return short if len(short) < len(segment.label) else segment.label


def fit_label(segment: BudgetSegment, width: int) -> str:
    """The segment's label in `width` cells: whole if it fits, else its short label, else cut with "…"."""
    for label in (segment.label, short_label(segment)):
        if len(label) <= width:
            return label
    return segment.label[: width - 1] + "…" if width > 0 else ""


def share_cells(needs: list[int], room: int) -> list[int]:
    """`room` cells shared between columns needing `needs`: the narrow ones get what they need, the rest share
    what is left evenly."""
    widths = [0] * len(needs)
    left = max(0, room)
    order = sorted(range(len(needs)), key=lambda i: needs[i])
    for done, col in enumerate(order):
        widths[col] = min(max(0, needs[col]), left // (len(needs) - done))
        left -= widths[col]
    return widths


def fit_label_widths(short_needs: list[int], full_needs: list[int], room: int) -> list[int]:
    """Label widths of the legend's columns in `room` cells: first every column's short labels whole; then, the
    cheapest first, every column that the rest of the room makes whole; what is left widens the others evenly."""
    widths = share_cells(short_needs, room)
    left = room - sum(widths)
    for col in sorted(range(len(widths)), key=lambda i: full_needs[i] - widths[i]):
        more = full_needs[col] - widths[col]
        if 0 < more <= left:
            widths[col] += more
            left -= more
    more_cells = share_cells([f - w for f, w in zip(full_needs, widths, strict=True)], left)
    return [w + m for w, m in zip(widths, more_cells, strict=True)]


class BudgetBar(Widget):
    """The per-token budget: stacked bar, zoomed bar, observed/target/roofline markers and a legend.

    | Class | Description |
    | :- | :- |
    | `budget-bar--seg-<component>` | One segment's colour (theme variable `$seg-<component>`). |
    | `budget-bar--seg-unexplained` | The unexplained remainder. |
    | `budget-bar--mark-observed` / `-target` / `-roofline` | The markers. |
    | `budget-bar--muted` | Stale values and secondary text. |
    | `budget-bar--missing` | Components with no figure yet. |
    | `budget-bar--title` | The first line. |
    | `budget-bar--header` | The line above the figures that must not be missed (CPU ranks, server unreachable). |
    | `budget-bar--warning` | What makes the figures moot (the weights do not fit the GPU's memory). |
    | `budget-bar--assumed` | "assumed, not observed" beside a default observed step. |
    | `budget-bar--moved-up` / `-down` | The Δ of a component slower / faster than at the baseline. |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "budget-bar--title",
        "budget-bar--muted",
        "budget-bar--missing",
        "budget-bar--header",
        "budget-bar--warning",
        "budget-bar--assumed",
        *_SEGMENT_CLASSES.values(),
        *_MARK_CLASSES,
        *_MOVED_CLASSES,
    }
    DEFAULT_CSS = _css()

    budget: reactive[BudgetView | None] = reactive(None)
    """What to draw; None until the first composition."""
    now_s: reactive[float] = reactive(0.0)
    """The wall-clock time ages are measured against (set by the app once a second)."""
    compact: reactive[bool] = reactive(False, layout=True)
    """Short legend (three columns, no ages: stale values are muted instead); the app sets it on short screens."""
    max_lines: reactive[int | None] = reactive(None, layout=True)
    """The rows the layout gives the bar (None: as many as it has); lines go by tier (`tui.widgets.tiers`)."""
    folded: reactive[bool] = reactive(False, layout=True)
    """Folded to its one-line verdict (the fold key)."""

    def _style(self, name: str) -> Style:
        """A component style, looked up once per render (the bar asks for one per cell); a name ending in
        `_ESTIMATE` is that style dimmed."""
        cache: dict[str, Style] = self.__dict__.setdefault("_style_cache", {})
        style = cache.get(name)
        if style is None:
            if name.endswith(_ESTIMATE):
                style = self._style(name.removesuffix(_ESTIMATE)) + Style(dim=True)
            else:
                style = self.get_component_rich_style(name, partial=True)
            cache[name] = style
        return style

    def tick(self, now_s: float) -> None:
        """Advance the clock; redraw only if an age or a stale mark on screen changes."""
        budget = self.budget
        if budget is not None:
            for seg in budget.segments:
                if seg.measured_at_s is None:
                    continue
                before, after = self.now_s - seg.measured_at_s, now_s - seg.measured_at_s
                if format_age_coarse(before) != format_age_coarse(after) or (before > STALE_AFTER_S) != (
                    after > STALE_AFTER_S
                ):
                    self.now_s = now_s
                    return
        self.set_reactive(BudgetBar.now_s, now_s)

    def _glyph(self, key: str) -> str:
        """The segment's own fill pattern (themes.palette.SEGMENT_PATTERNS): segments differ without colour too."""
        return segment_pattern(key)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """Lines `render` produces at `width`."""
        self.__dict__["_style_cache"] = {}
        return len(self._lines(max(10, width)))

    def render(self) -> Text:
        """The whole panel as one Text."""
        self.__dict__["_style_cache"] = {}
        return Text("\n").join(self._lines(max(10, self.content_region.width or self.size.width)))

    # -- drawing -------------------------------------------------------------------------------------------------

    def _lines(self, width: int) -> list[Text]:
        """The lines that fit the rows given, lowest tiers first, in display order."""
        if self.folded:
            return [self._folded_line(width)]
        return tiers.keep_lines(self.tiered_lines(width), self.max_lines, self._style("budget-bar--muted"))

    def _folded_line(self, width: int) -> Text:
        """The box's one line: the model and the verdict (the model left out where it would cut the verdict); a
        warning that makes the figures moot comes first."""
        budget = self.budget
        if budget is None:
            return Text("composing the budget…", style=self._style("budget-bar--muted"))
        if budget.warnings:
            return _cut(Text(budget.warnings[0], style=self._style("budget-bar--warning")), width)
        title = Text(f"{budget.title} · ", style=self._style("budget-bar--title"))
        verdict = self._verdict_line(budget, width)
        if self._verdict_line(budget, width - title.cell_len).plain == verdict.plain:
            return title + verdict  # the model too, where it costs the verdict no word
        return verdict

    def tiered_lines(self, width: int) -> TieredLines:
        """Every line the bar has at `width`, each with its tier, in display order."""
        budget = self.budget
        muted = self._style("budget-bar--muted")
        if budget is None:
            return [(tiers.VERDICT, Text("composing the budget…", style=muted))]
        out: TieredLines = []
        header = self._style("budget-bar--header")
        out += [(tiers.VERDICT, _cut(Text(line, style=header), width)) for line in budget.header.splitlines() if line]
        for warning in budget.warnings:  # the deployment cannot load: no tuning verdict, the reason instead
            out += [
                (tiers.VERDICT, Text(line, style=self._style("budget-bar--warning"))) for line in _wrap(warning, width)
            ]
        out.append((tiers.VERDICT, self._verdict_line(budget, width)))
        out.append((tiers.DETAIL, self._detail_line(budget, width)))
        if budget.ranks_text:
            out.append((tiers.DETAIL, _cut(Text(budget.ranks_text, style=muted), width)))
        for said in (budget.straggler, budget.contention):  # who else ran on the GPUs: before any figure is read
            out += [(tiers.DETAIL, Text(line, style=header)) for line in _wrap(said, width) if said]
        if budget.verdict and not budget.warnings:
            roof = self._style("budget-bar--mark-roofline")
            out += [(tiers.DETAIL, Text(line, style=roof)) for line in _wrap(budget.verdict, width)]
        full_scale = max(budget.observed_ms, budget.explained_ms, budget.target_ms, budget.roofline_ms or 0.0)
        markers = self._markers(budget)
        label_width = 11
        bar_width = max(10, width - label_width)
        full_label = f"0–{ms_text(full_scale)}"
        out.append((tiers.BAR, self._bar_line(budget, full_label, label_width, bar_width, full_scale, True)))
        out.append((tiers.BAR, self._marker_line(markers, label_width, bar_width, full_scale)))
        zoom_scale = ZOOM_HEADROOM * max(budget.explained_ms, budget.target_ms, budget.roofline_ms or 0.0)
        if zoom_scale > 0 and full_scale >= ZOOM_WORTH_IT * zoom_scale:
            zoom_label = f"0–{ms_text(zoom_scale)}"
            out.append((tiers.ZOOM, self._bar_line(budget, zoom_label, label_width, bar_width, zoom_scale, False)))
            out.append((tiers.ZOOM, self._marker_line(markers, label_width, bar_width, zoom_scale)))
        out += [(tiers.LEGEND, line) for line in self._legend(budget, width)]
        out.append((tiers.DETAIL, self._key_line(budget, width)))
        out += [(tiers.DETAIL, _cut(Text(note, style=muted), width)) for note in budget.note.splitlines()]
        return out

    def _verdict_line(self, budget: BudgetView, width: int) -> Text:
        """Explained, unexplained, observed and target with their units, in the longest form that fits `width`."""
        observed, explained = budget.observed_ms, budget.explained_ms
        over = explained - observed
        assumed = budget.observed_assumed
        share = 100.0 * budget.unexplained_ms / observed if observed > 0 else 0.0
        of = f"of the {'assumed ' if assumed else ''}observed step"
        tps = f" ({1000.0 / budget.target_ms:.0f} tok/s)" if budget.target_ms > 0 else ""
        styles = {
            "explained": Style(bold=True),
            "rest": self._style(_SEGMENT_CLASSES["unexplained"]),
            "over": self._style("budget-bar--mark-observed"),
            "observed": self._style("budget-bar--mark-observed"),
            "assumed": self._style("budget-bar--assumed"),
            "target": self._style("budget-bar--mark-target"),
        }

        def form(spaced: bool, rest: str, obs: tuple[str, str], target_note: str) -> Text:
            """One wording: `obs` is the observed step's label and its note ("(assumed)"), `target_note` follows the
            target ("(309 tok/s) · roofline 2.10 ms")."""
            ms = format_duration if spaced else ms_text
            text = Text()
            text.append("explained ")
            text.append(ms(explained), style=styles["explained"])
            if rest:
                text.append(" · ")
                text.append(rest, style=styles["over" if over > 0 else "rest"])
            text.append(" · ")
            text.append(f"{obs[0]} ", style=styles["observed"])
            text.append(ms(observed))
            if obs[1]:
                text.append(f" {obs[1]}", style=styles["assumed"])
            text.append(" · ")
            text.append("target ", style=styles["target"])
            text.append(ms(budget.target_ms) + target_note)
            return text

        if over > 0:
            rests = [
                f"{EXCEEDS_OBSERVED} {format_duration(over)}",
                f"exceeds observed by {ms_text(over)}",
                f"over by {ms_text(over)}",  # at 80 columns: the excess still said, never left out
            ]
        else:
            left = budget.unexplained_ms
            rests = [f"unexplained {format_duration(left)} ({share:.0f}% {of})", *[f"unexplained {ms_text(left)}"] * 2]
        traced = budget.observed_source == "trace"  # the engine's steps in the loaded trace: the traced bar's file
        long_obs = ("observed", "assumed, not observed" if assumed else "in the trace" if traced else "")
        obs = ("observed", "(assumed)" if assumed else "in the trace" if traced else "")
        short_obs = ("obs", "(assumed)" if assumed else "")
        forms = [
            form(True, rests[0], long_obs, tps),
            form(True, rests[0], obs, tps),
            form(False, rests[1], obs, tps),
            form(False, rests[1], obs, ""),
            form(False, rests[2], obs, ""),
            form(False, "", obs, ""),
            form(False, "", short_obs, ""),
        ]
        for text in forms:
            if text.cell_len <= width:
                return text
        return _cut(forms[-1], width)

    def _detail_line(self, budget: BudgetView, width: int) -> Text:
        """Where the observed step came from, the roofline and how far the target is."""
        text = Text()
        if budget.roofline_ms is not None:
            text.append("roofline ", style=self._style("budget-bar--mark-roofline"))
            text.append(format_duration(budget.roofline_ms))
        elif budget.hardware_text:
            text.append("roofline ", style=self._style("budget-bar--mark-roofline"))
            text.append(budget.hardware_text if budget.hardware_text.startswith("n/a") else "n/a")
        gap = budget.observed_ms / budget.target_ms if budget.target_ms > 0 else 0.0
        if gap > 1:
            text.append(f"{' · ' if text else ''}{gap:.1f}× over target", style=self._style("budget-bar--muted"))
        if budget.observed_text:
            text.append(f"{' · ' if text else ''}step {budget.observed_text}", style=self._style("budget-bar--muted"))
        return _cut(text, width)

    def _key_line(self, budget: BudgetView, width: int) -> Text:
        """What the legend's figures are: ms per decode step, % of the (assumed) observed step, and its marks."""
        of = "the assumed observed step" if budget.observed_assumed else "the observed step"
        text = Text(
            f"ms per decode step · % of {of} · ~ interpolated · ≈ roofline estimate · ↺ from an earlier session"
            " · Δ since the baseline",
            style=self._style("budget-bar--muted"),
        )
        return _cut(text, width)

    def _markers(self, budget: BudgetView) -> list[_Marker]:
        markers = [
            _Marker(budget.target_ms, "◆", "target", "budget-bar--mark-target"),
            _Marker(budget.observed_ms, "▲", "observed", "budget-bar--mark-observed"),
        ]
        if budget.roofline_ms is not None:
            markers.append(_Marker(budget.roofline_ms, "◇", "roofline", "budget-bar--mark-roofline"))
        return sorted(markers, key=lambda m: m.position_ms)

    def _bar_line(  # noqa: PLR0917
        self, budget: BudgetView, label: str, label_width: int, bar_width: int, scale_ms: float, full: bool
    ) -> Text:
        cells: list[tuple[str, str]] = [(" ", "")] * bar_width
        position = 0.0
        for segment in budget.components:
            if segment.ms <= 0 or segment.status == "missing":
                continue
            start = position
            position += segment.ms
            cls = _SEGMENT_CLASSES[segment.key] + (_ESTIMATE if segment.estimated else "")
            self._fill(cells, start, position, scale_ms, self._glyph(segment.key), cls)
        end = budget.observed_ms if full else max(budget.observed_ms, position)
        if end > position:
            self._fill(cells, position, end, scale_ms, UNEXPLAINED_GLYPH, _SEGMENT_CLASSES["unexplained"])
        text = Text(label.rjust(label_width - 1)[: label_width - 1] + " ", style=self._style("budget-bar--muted"))
        overflow = not full and end > scale_ms
        if overflow:
            cells[-1] = ("»", _SEGMENT_CLASSES["unexplained"])
        for char, cls in cells:
            text.append(char, style=self._style(cls) if cls else "")
        return text

    @staticmethod
    def _fill(  # noqa: PLR0917
        cells: list[tuple[str, str]], start_ms: float, end_ms: float, scale_ms: float, glyph: str, cls: str
    ) -> None:
        width = len(cells)
        first = round(start_ms / scale_ms * width)
        last = round(end_ms / scale_ms * width)
        if last == first and end_ms > start_ms and first < width:
            last = first + 1  # never let a non-zero segment vanish; it takes at least one cell
        hatched = cls.endswith(_ESTIMATE)
        for n, i in enumerate(range(max(0, first), min(width, last))):
            if cells[i][1] == "" or glyph != UNEXPLAINED_GLYPH:
                cells[i] = (ESTIMATE_GAP if hatched and n % 2 else glyph, cls)

    def _marker_line(self, markers: list[_Marker], label_width: int, bar_width: int, scale_ms: float) -> Text:
        cells: list[tuple[str, str]] = [(" ", "")] * bar_width
        placed: list[tuple[int, _Marker]] = []
        for marker in markers:
            if marker.position_ms > scale_ms * 1.0001:
                continue
            col = min(bar_width - 1, max(0, round(marker.position_ms / scale_ms * bar_width) - 1))
            cells[col] = (marker.glyph, marker.style_class)
            placed.append((col, marker))
        for col, marker in placed:
            for label in (f"{marker.label} {ms_text(marker.position_ms)}", marker.label, marker.label[0]):
                start = self._label_start(cells, col, len(label))
                if start is not None:
                    for offset, char in enumerate(label):
                        cells[start + offset] = (char, marker.style_class)
                    break
        text = Text(" " * label_width)
        for char, cls in cells:
            text.append(char, style=self._style(cls) if cls else "")
        text.rstrip()
        return text

    @staticmethod
    def _label_start(cells: list[tuple[str, str]], col: int, length: int) -> int | None:
        """Where a label of `length` fits beside the marker at `col` (right first, then left), or None."""
        width = len(cells)
        right = col + 1
        if right + length <= width and all(c[0] == " " for c in cells[right : min(width, right + length + 1)]):
            return right
        left = col - length
        if left >= 0 and all(c[0] == " " for c in cells[max(0, left - 1) : col]):
            return left
        return None

    def _legend(self, budget: BudgetView, width: int) -> list[Text]:
        """The legend in columns filled top to bottom over the whole `width`: as many columns as the narrowest
        entry allows, as few as keep that many rows; each column as wide as its own figures and labels, the labels
        whole where the room allows (`fit_label_widths`), else short (never two figures run together)."""
        entries: list[LegendEntry] = []
        missing: list[str] = []
        for segment in budget.components:
            if segment.status == "missing":
                missing.append(segment.label)
            else:
                entries.append(self._legend_parts(budget, segment))
        over = budget.explained_ms - budget.observed_ms
        remainder = (  # the parts exceed the observed step: by how much, never a clamped 0
            BudgetSegment(key="over_observed", label="over observed", ms=over, status="remainder")
            if over > 0
            else BudgetSegment(key="unexplained", label="unexplained", ms=budget.unexplained_ms, status="remainder")
        )
        entries.append(self._legend_parts(budget, remainder))
        narrowest = COMPACT_ENTRY_WIDTH if self.compact else LEGEND_ENTRY_WIDTH
        gap = COMPACT_GAP if self.compact else LEGEND_GAP
        most = max(1, min(len(entries), (width + gap) // narrowest))
        for tried in range(most, 0, -1):
            rows = math.ceil(len(entries) / tried)
            groups = [entries[col * rows : (col + 1) * rows] for col in range(math.ceil(len(entries) / rows))]
            columns = self._legend_columns(groups, width, gap)
            if sum(c.cells for c in columns) <= width or tried == 1:
                break
        lines: list[Text] = []
        for row in range(rows):
            line = Text()
            for group, column in zip(groups, columns, strict=True):
                if row < len(group):
                    line.append_text(self._legend_entry(group[row], column))
            line.rstrip()
            lines.append(_cut(line, width))
        if missing:
            text = Text("no figure yet: " + ", ".join(missing), style=self._style("budget-bar--missing"))
            text.truncate(width, overflow="ellipsis")
            lines.append(text)
        return lines

    @staticmethod
    def _legend_columns(groups: list[list[LegendEntry]], width: int, gap: int) -> list[LegendColumn]:
        """Each column's widths: figures and tails as wide as their widest, labels from the room that leaves."""
        fixed = [
            LegendColumn(
                0,
                max(e.value.cell_len for e in group),
                max(e.tail.cell_len for e in group),
                gap if n < len(groups) - 1 else 0,
            )
            for n, group in enumerate(groups)
        ]
        room = width - sum(c.cells for c in fixed)
        labels = fit_label_widths(
            [max(len(short_label(e.segment)) for e in group) for group in groups],
            [max(len(e.segment.label) for e in group) for group in groups],
            room,
        )
        return [dataclasses.replace(c, label_cells=cells) for c, cells in zip(fixed, labels, strict=True)]

    def _legend_parts(self, budget: BudgetView, segment: BudgetSegment) -> LegendEntry:
        """One segment's glyph, figure and tail: "0.500ms" then "0.5% 10m" (compact: "≈0.500ms" then "0.5%"); a
        figure from an earlier session ends in "↺"; a component that moved since the baseline shows its signed change
        in place of the share and age."""
        cls = _SEGMENT_CLASSES.get(segment.key, _SEGMENT_CLASSES["unexplained"])
        glyph = UNEXPLAINED_GLYPH if segment.status == "remainder" else self._glyph(segment.key)
        share = 100.0 * segment.ms / budget.observed_ms if budget.observed_ms > 0 else 0.0
        stale = segment.measured_at_s is not None and self.now_s - segment.measured_at_s > STALE_AFTER_S
        value_style = self._style("budget-bar--muted") if stale else Style()
        mark = STATUS_MARKS.get(segment.status, "")
        move = None if segment.estimated else budget.move(segment.key)  # an estimate keeps its ≈, never a Δ
        move_style = self._style(_MOVED_CLASSES[0] if move is not None and move.delta_ms > 0 else _MOVED_CLASSES[1])
        stored = "↺" if segment.stored else ""
        tail = Text()
        if self.compact:
            if move is not None:  # the change since the baseline says more than the share (and the status mark)
                value = Text(short_ms_text(segment.ms), style=value_style)
                tail.append(format_delta_ms(move.delta_ms, compact=True), style=move_style)
            else:
                value = Text(mark + short_ms_text(segment.ms), style=value_style)
                pct = f"{share:.1f}%" if share < 10 else f"{share:.0f}%" if share < MAX_SHARE_PCT else ">1k%"
                tail.append(f"{pct:>4}{stored}", style=value_style)
            return LegendEntry(segment, Text(glyph, style=self._style(cls)), value, tail)
        value = Text(ms_text(segment.ms), style=value_style)
        if move is not None:  # "Δ+0.612 ms" over the share and the age: what changed since the baseline
            tail.append(format_delta_ms(move.delta_ms), style=move_style)
        else:
            pct = f"{share:.1f}%" if share < 100 else f"{share:.0f}%" if share < MAX_SHARE_PCT else ">999%"
            tail.append(f"{pct:>5}", style=value_style)
            age = format_age_coarse(self.now_s - segment.measured_at_s) if segment.measured_at_s is not None else ""
            age = mark + age + stored  # "~" interpolated between measured points, "≈" a roofline estimate
            if age:
                tail.append(f" {age}", style=self._style("budget-bar--muted"))
        return LegendEntry(segment, Text(glyph, style=self._style(cls)), value, tail)

    @staticmethod
    def _legend_entry(entry: LegendEntry, column: LegendColumn) -> Text:
        """One entry drawn at its column's widths (`column.cells` wide): each part after a space, so two figures
        never run together however large they get."""
        text = Text()
        text.append_text(entry.glyph)
        text.append(" " + fit_label(entry.segment, column.label_cells).ljust(column.label_cells) + " ")
        text.append(" " * (column.value_cells - entry.value.cell_len))
        text.append_text(entry.value)
        text.append(" ")
        text.append_text(entry.tail)
        text.append(" " * (column.tail_cells - entry.tail.cell_len + column.gap_cells))
        return text

    def watch_compact(self) -> None:
        """Redraw when the legend changes shape."""
        self.refresh(layout=True)

    def watch_budget(self) -> None:
        """Redraw on a new budget; a layout pass only when the panel's height changes (a full-screen re-layout on
        every finished probe showed as a 50-70 ms event-loop stall on a 2-core box)."""
        width = max(10, self.content_region.width or self.size.width)
        height = len(self._lines(width))
        self.refresh(layout=height != self.content_region.height)


def _cut(text: Text, width: int) -> Text:
    """`text` cut to `width` cells, ending in an ellipsis where it was longer."""
    if text.cell_len > width:
        text = text.copy()
        text.truncate(width, overflow="ellipsis")
    return text


def _wrap(text: str, width: int) -> list[str]:
    """`text` wrapped to `width` (at least 20) columns."""
    return textwrap.wrap(text, max(20, width))
