"""Provides ProbeQueue: the probes waiting to run, in order, without duplicates; safe across threads."""

from __future__ import annotations

import threading
from collections import deque


class ProbeQueue:
    """A FIFO of probe ids. The event loop pushes and clears; the probe worker thread pops (with a timeout)."""

    def __init__(self) -> None:
        self._items: deque[str] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def push(self, probe_id: str) -> bool:
        """Queue `probe_id` unless it is already waiting; returns True if it was added."""
        with self._cond:
            if self._closed or probe_id in self._items:
                return False
            self._items.append(probe_id)
            self._cond.notify()
            return True

    def pop(self, timeout_s: float) -> str | None:
        """The next id, or None after `timeout_s` or once closed."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout_s)
            if self._closed or not self._items:
                return None
            return self._items.popleft()

    def clear(self) -> list[str]:
        """Drop every waiting id and return them."""
        with self._cond:
            dropped = list(self._items)
            self._items.clear()
            return dropped

    def close(self) -> None:
        """Wake the consumer and refuse further pushes."""
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """True after `close`."""
        return self._closed

    def __contains__(self, probe_id: object) -> bool:
        with self._cond:
            return probe_id in self._items

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
