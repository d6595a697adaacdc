"""Signals the suite hands down to the processes its tests start.

A suite started in the background by a non-interactive shell (`bash scripts/test &`, `flock … &` from a script)
inherits SIGINT ignored, and an ignored signal stays ignored across fork and exec: every `decodetop` a test starts
would ignore the SIGINT the Ctrl-C tests send, and they waited out their deadline (a failure that came and went
with how the suite was started, not with load). A handler, unlike SIG_IGN, is reset to the default at exec, so one
installed in the test process gives each child the default again: Ctrl-C ends it as at a terminal.
"""

from __future__ import annotations

import signal


def interruptible_children() -> None:
    """Where SIGINT is ignored in this process, take it as Python's default (KeyboardInterrupt) so the processes a
    test starts get SIGINT's default disposition. Main thread only (tests/conftest.py calls it at configure)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
