"""Quitting the UI never waits on a slow `--server`: with a loopback server that trickles one byte every 1.5 s
(per-read timeouts never fire) and a poll in flight, `q` ends the app, and the poller's daemon thread is left to its
poll rather than joined. How long quitting takes is measured in benchmarks/ui/quit_with_slow_server.py."""

from __future__ import annotations

import dataclasses

from decodetop.collectors.serving import ServerStepSource
from decodetop.tui.sources.server import ServerPoller
from tests.helpers.trickle_server import TricklingServer

from .conftest import make_app, wait_until
from .fakes import make_sources

TRICKLE_S = 1.5
"""One byte every 1.5 s: the slow server of the hostile-input review."""
LONG_DEADLINE_S = 600.0
"""Longer than any test: the poll is certainly still in flight when `q` is pressed and when the app has ended."""


async def test_quit_leaves_a_slow_server_poll_behind() -> None:
    with TricklingServer(interval_s=TRICKLE_S) as slow:
        poller = ServerPoller(ServerStepSource(slow.url, timeout_s=LONG_DEADLINE_S), period_s=0.05)
        app = make_app(dataclasses.replace(make_sources(), server=poller))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: slow.connections >= 1, "the poll reached the server")
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value == 0, "quit")
        thread = poller._thread
        assert thread is not None and thread.daemon
        assert thread.is_alive(), "quit waited for the poll to finish"
        assert slow.sent < slow.total_bytes and app.server_note == ""  # no answer came: the poll is still reading
