"""Helpers for tests of the main screen at every size: a whole probe plan (ten probes, as a real model's), waiting
for it, counting the probe rows on screen, reading the screen's text and finding figures without a unit."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from textual.pilot import Pilot

from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import ProbeState, ProbeView, RankValue
from decodetop.tui.sources import ProbeOutcome, ProgressCallback
from decodetop.tui.widgets.budget_bar import BudgetBar

from .fakes import NOW_S, FakeProbes

PLAN: tuple[tuple[str, str, str, float], ...] = (
    ("membw", "memory bandwidth", "4.31 TB/s @ 1 GiB copy", 0.0),
    ("allreduce", "all-reduce", "41.2 µs @ 32 KiB", 6.55),
    ("gemm", "GEMM at decode shapes", "2.91 TB/s @ M=1", 3.2),
    ("moe", "MoE routing and experts", "0.212 ms @ 8 of 256 experts", 0.0),
    ("attention", "attention (MLA)", "0.118 ms @ context=4096", 0.0),
    ("norms", "norms & elementwise", "9.8 µs @ 7168", 0.0),
    ("sampling", "lm_head & sampling", "0.215 ms @ vocab=154880", 0.0),
    ("launch", "kernel launch", "9.6 µs/op", 1.5),
    ("kvcast", "KV cache casts", "3.1 µs @ 576", 0.0),
    ("layer", "a whole layer", "0.433 ms @ layer 3 [graph]", 0.0),
)
"""A model's probe plan: id, title, the row's value (with its unit) and the ms the fake budget composes from."""


class PlanProbes(FakeProbes):
    """The fake probe group over `PLAN` (ten rows, each measured 30 s before the clock)."""

    def plan(self, settings: Settings) -> list[ProbeView]:
        return [ProbeView(probe_id=pid, title=title) for pid, title, _, _ in PLAN]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        self.runs.append(probe_id)
        value, ms = next((v, m) for pid, _, v, m in PLAN if pid == probe_id)
        view = ProbeView(
            probe_id, "", ProbeState.DONE, value_text=value, measured_at_s=NOW_S - 30, ranks=(RankValue(0, value),)
        )
        return ProbeOutcome(view=view, payload={"value": value, "ms": ms}, result=ms if ms else None)

    def restore(self, probe_id: str, payload: Mapping[str, object], measured_at_s: float) -> ProbeOutcome | None:
        return None


def ready(app: DecodetopApp) -> bool:
    """The plan measured, the checks in, the budget composed and shown."""
    return (
        len(app.probe_views) == len(PLAN)
        and all(v.state is ProbeState.DONE for v in app.probe_views.values())
        and bool(app.checks)
        and app.query_one(BudgetBar).budget is not None
        and app.budget_settled
    )


def screen_text(app: DecodetopApp) -> str:
    """What the terminal shows now (the active screen, modals included)."""
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def rows_shown(app: DecodetopApp) -> int:
    """How many of the plan's probe rows are on screen (a title cut with "…" counts)."""
    text = screen_text(app)
    return sum(1 for _, title, _, _ in PLAN if any(line.lstrip().startswith(title[:10]) for line in text.splitlines()))


def box_lines(text: str) -> list[str]:
    """The budget box's rows in a screen's text: inside its border (the title row left out), or the one folded row."""
    lines = text.splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("╭")), None)
    if top is None:
        return lines[:1]
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return [line.strip("│ ") for line in lines[top + 1 : bottom]]


_NUMBER = re.compile(r"(?<![\w.+\-–/@=×])[~≈>+\-Δ]*\d+(?:[.,]\d+)*(?:e[+-]\d+)?")
"""A figure: not part of a name ("glm-5", "TP8", "5x16", "m=1"), a sign or mark in front of it kept."""
_UNIT = re.compile(r"(?:ms|µs|ns|s|%|×|m|h|d|k%|–| ?(?:ms|µs|s|tok/s|GB|GiB|TB/s|GB/s|kernels?|of|more|per)\b)")
"""What must follow it: a unit, a share, an age, a range's dash, or a count's word."""
_NAMES = re.compile(r"\b(?:GPU|GPUs|rank|ranks|TP|CPU rank|layer|Gen)\s+\d+")
"""Names that end in a number: they are not figures."""


def bare_numbers(text: str) -> list[str]:
    """The figures of `text` with no unit after them."""
    cleaned = _NAMES.sub("", text)
    return [m.group(0) for m in _NUMBER.finditer(cleaned) if not _UNIT.match(cleaned, m.end())]


def waited(
    app: DecodetopApp, *keys: str, extra: Callable[[], bool] = lambda: True
) -> Callable[[Pilot[object]], object]:
    """A snapshot's `run_before`: wait for the plan, press `keys`, let the screen settle."""
    from .conftest import wait_until

    async def run_before(pilot: Pilot[object]) -> None:
        await wait_until(pilot, lambda: ready(app) and extra(), "the plan measured and the budget shown")
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.1)

    return run_before
