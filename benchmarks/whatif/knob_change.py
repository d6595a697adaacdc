"""How long a knob change on the live UI's what-if screen (`w`) takes to re-compose: from the key press to the
comparison redrawn with the new variant (the prediction through `decodetop.pipeline.whatif.predict`, the message
back to the event loop, the widgets' update and one repaint). Target: under 100 ms on a 2-core machine.

The app runs headless (`App.run_test`) over the real budget source with a recorded plan run stored in a temporary
history (as `tests/tui/whatif_app.py` builds it for the screen's tests), opens `w`, then turns knobs two ways:

- ahead: between two key presses the screen has predicted every knob's neighbours and repainted its chart (a user
  reading the screen, 0.3 s; the screen predicts ahead by itself once a comparison and its chart are shown): the
  press finds its variant kept;
- cold: nothing predicted ahead (the screen's look-ahead switched off and each press a variant never composed):
  a new deployment's inventory, plan and composition (10–300 ms, docs/benchmarks.md "What-ifs");
- rapid: the look-ahead on, each press made as soon as the previous one's comparison is drawn, its chart's points
  still being predicted (a knob turned several steps): the key's own prediction must not wait for that chart.

    .venv/bin/python benchmarks/whatif/knob_change.py [--plan PATH --model NAME] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.tui.whatif_app import GPU_PLAN, MODEL, whatif_app  # noqa: E402
from textual import events  # noqa: E402

from decodetop.tui.screens.whatif import WhatIfScreen  # noqa: E402
from decodetop.tui.widgets.whatif_compare import WhatIfCompare  # noqa: E402

KEYS = ("B", "P", "C", "K", "F", "A", "L", "R", "b", "p", "c", "k", "f", "a", "l", "r")
"""Each knob up, then down: every press a variant the previous one's look-ahead covers."""
COLD_KEYS = ("P", "C", "K", "F", "L", "R", "E", "C")
"""Knobs off the chart's axis (batch), each press a deployment not composed before."""
RAPID_KEYS = ("c", "F", "P", "K", "L", "R", "A", "c")
"""From the current deployment again, another chain of deployments not composed before (the first press one the
look-ahead of the current deployment covers)."""
POLL_S = 0.001
READ_S = 0.3
"""Between two key presses in the ahead case: a user reading the screen (the chart's repaint of the last key, tens
of ms of plotext, lands in that pause rather than in the next key's frame)."""


async def _until(condition: Any, timeout_s: float = 120.0) -> None:
    """Let the event loop run until `condition()` holds (asyncio sleeps: Pilot's own waits wait for the whole
    process to go idle, look-ahead threads included, which is not what a user waits for)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the what-if screen did not answer")
        await asyncio.sleep(POLL_S)


async def _press_timed(app: Any, screen: WhatIfScreen, key: str) -> float:
    """ms from the key event to the comparison of the new state drawn (its widget's next render)."""
    compare = screen.query_one(WhatIfCompare)
    drawn: list[object] = []
    render = compare.render

    def noted() -> Any:
        out = render()
        drawn.append(compare.view)
        return out

    compare.render = noted  # type: ignore[method-assign]
    t0 = time.perf_counter()
    app.post_message(events.Key(key, key))
    seq = screen.seq + 1
    await _until(lambda: screen.shown_seq >= seq and bool(drawn) and drawn[-1] is screen.view)
    elapsed = 1e3 * (time.perf_counter() - t0)
    compare.render = render  # type: ignore[method-assign]
    return elapsed


async def _run(plan: Path, model: str, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"ahead": [], "cold": [], "rapid": [], "open": []}
    with tempfile.TemporaryDirectory() as tmp:
        app = whatif_app(Path(tmp), plan=plan, model=model)
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(lambda: app.budget_settled and bool(app.results))
            t0 = time.perf_counter()
            await pilot.press("w")
            await _until(lambda: isinstance(app.screen, WhatIfScreen) and app.screen.settled)
            out["open"].append(1e3 * (time.perf_counter() - t0))
            screen = app.screen
            assert isinstance(screen, WhatIfScreen)
            for _ in range(rounds):
                for key in KEYS:
                    await _until(lambda: screen.idle)  # chart drawn, look-ahead done
                    await asyncio.sleep(READ_S)  # the chart's repaint of the previous key done, as a user reads
                    out["ahead"].append(await _press_timed(app, screen, key))
            await pilot.press("0")
            await _until(lambda: screen.idle)
            screen._ahead = lambda *_args: None  # type: ignore[method-assign]
            for key in COLD_KEYS:
                await _until(lambda: screen.idle)
                out["cold"].append(await _press_timed(app, screen, key))
            del screen._ahead  # the look-ahead back on
            await pilot.press("0")
            await _until(lambda: screen.idle)
            for key in RAPID_KEYS:
                out["rapid"].append(await _press_timed(app, screen, key))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, default=GPU_PLAN, help="a recorded plan run (decodetop probe --json)")
    ap.add_argument("--model", default=MODEL, help="its model preset (TP 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("DECODETOP_STATE_DIR", tempfile.mkdtemp())
    times = asyncio.run(_run(args.plan, args.model, args.rounds))
    load = os.getloadavg()[0]
    where = f"{os.cpu_count()} CPUs, load average {load:.1f}, Python {platform.python_version()}"
    print(f"{args.model} from {args.plan.name}; {where}")
    for name, values in times.items():
        if not values:
            continue
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        print(
            f"  {name:>5}: median {statistics.median(values):6.1f} ms, p90 {p90:6.1f} ms, max {max(values):6.1f} ms "
            f"({len(values)} presses)"
        )
    if args.json:
        args.json.write_text(json.dumps({"plan": str(args.plan), "model": args.model, "load": load, **times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
