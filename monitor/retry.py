"""The one way sessionwatch tries again: delays that double up to a cap, a wait that a stop
cuts short, and whether this failure is the first of its run (what is said once in the
log). Used by opening a locked database, by listening for PostgreSQL's change notices and
by the wake call."""

from __future__ import annotations

import asyncio
import contextlib


class Backoff:
    """Delays from ``first``, doubling up to ``cap``; :meth:`reset` after a success."""

    __slots__ = ("cap", "delay", "first")

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self.delay = first

    @property
    def fresh(self) -> bool:
        """No wait taken since the last success: the failure at hand is the first."""
        return self.delay == self.first

    def reset(self) -> None:
        self.delay = self.first

    def next(self) -> float:
        """The next delay, for a caller that waits on its own timers."""
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    async def wait(self, stopping: asyncio.Event | None = None) -> bool:
        """Sleep the next delay, or less when ``stopping`` is set; True when it is."""
        delay = self.next()
        if stopping is None:
            await asyncio.sleep(delay)
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        return stopping.is_set()
