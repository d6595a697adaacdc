"""Helpers for the UI tests: build the app over fixed sources, wait on conditions instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.app import App
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.pilot import Pilot
from textual.widgets import Input

from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.sources import Sources

WAIT_S = 10.0
"""Upper bound for a condition to come true (workers are threads; on 2 busy CI cores they can lag)."""


HELD_TOAST_S = 3600.0
"""How long a toast stays up in tests. The app's own 2-3 s would let a snapshot taken on a loaded machine (the
keys before it slower than the toast) miss a toast that a quick run shows: the snapshot would then depend on load."""


def make_app(sources: Sources, settings: Settings | None = None, **kwargs: object) -> DecodetopApp:
    """The app with ages frozen (no refresh timer), toasts held and settings not saved unless asked."""
    kwargs.setdefault("save_theme", False)
    kwargs.setdefault("age_refresh_s", 0)
    app = DecodetopApp(sources, settings or Settings(model="glm-5", tp=8), **kwargs)  # type: ignore[arg-type]
    hold_toasts(app)
    return app


def hold_toasts(app: App[object]) -> None:
    """Make every toast of `app` stay up `HELD_TOAST_S` whatever timeout the app gives it."""
    notify = app.notify

    def held(
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        notify(message, title=title, severity=severity, timeout=HELD_TOAST_S, markup=markup)

    app.notify = held  # type: ignore[method-assign]


async def wait_until(pilot: Pilot[object], condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Let the app process messages until `condition()` holds; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.01)
    await pilot.pause()


async def steady_cursors(pilot: Pilot[object]) -> None:
    """Stop the blinking of every input's cursor on the current screen, leaving it shown: a snapshot taken more
    than a blink (0.5 s) after the last key, as on a loaded machine, would otherwise catch it hidden."""
    for box in pilot.app.query(Input):
        box.cursor_blink = False
    await pilot.pause()


class IdlePolls:
    """Counts the probe worker's polls that found the queue empty, so "no probe ran" waits for a real signal (the
    worker looked and found nothing) instead of a fixed sleep. Install it before the app starts."""

    def __init__(self, app: DecodetopApp) -> None:
        self.count = 0
        queue = app.queue
        pop = queue.pop

        def counted(timeout_s: float) -> str | None:
            got = pop(timeout_s)
            if got is None:
                self.count += 1
            return got

        queue.pop = counted  # type: ignore[method-assign]

    async def wait(self, pilot: Pilot[object], what: str = "the probe worker to find nothing to run") -> None:
        """Wait for two more empty polls: the second began after this call, so nothing was queued meanwhile."""
        seen = self.count
        await wait_until(pilot, lambda: self.count >= seen + 2, what)


class MessageLog(list[Message]):
    """A message_hook that keeps every message; `of(type)` filters."""

    def __call__(self, message: Message) -> None:
        self.append(message)

    def of(self, kind: type[Message]) -> list[Message]:
        return [m for m in self if isinstance(m, kind)]
