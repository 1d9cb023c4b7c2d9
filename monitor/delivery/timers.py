"""The time delivery and the ticks run on, given from outside: the clock, the timers and the
waits of the ledger's passes, the hooks client and the tick schedule (``serve/ticks.py``).
The running service uses the event loop's; a test moves a manual one, so that no wake or
tick test sleeps for real.

Two clocks: what is stored or shown is wall-clock (``now_ms``); what is timed (a window, a
quiet period, a retry) is monotonic (``monotonic``, and every timer), so that a step of the
wall clock (an NTP correction, a restored VM) neither stalls nor hurries a wake."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from monitor.clock import Clock, now_ms


class Handle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch (wall-clock): for what is stored or shown."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps: for what is timed."""
        ...

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Handle:
        """Run ``fn`` once ``delay_s`` has passed."""
        ...

    async def sleep(self, delay_s: float) -> None: ...


class LoopTimers:
    """The event loop's timers, on ``clock`` (the store's, which a simulation may move)."""

    def __init__(self, clock: Clock = now_ms) -> None:
        self._clock = clock

    def now_ms(self) -> int:
        return self._clock()

    def monotonic(self) -> float:
        return time.monotonic()  # the event loop's own clock

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Handle:
        return asyncio.get_running_loop().call_later(delay_s, fn)

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
