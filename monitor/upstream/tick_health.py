"""Whether the tick keeps up, for the status page: the last tick's time, duration and
adapters over budget, and a pulse that wakes every page waiting for the next tick."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from monitor.upstream.settle import BUDGET_EXCEEDED, LinkResult


class Pulse:
    """Counters that wake everyone waiting for them to move (one status page or many):
    ``count`` moves with every beat, ``news`` only with those worth showing at once."""

    def __init__(self) -> None:
        self.count = 0
        self.news = 0
        self._moved: asyncio.Event | None = None

    def beat(self, news: bool = False) -> None:
        self.count += 1
        self.news += news
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    async def after(self, seen: int, timeout: float) -> int:
        """The count once it is past ``seen``, or as it is after ``timeout``."""
        if self.count == seen:
            if self._moved is None:
                self._moved = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), timeout)
        return self.count


@dataclass(slots=True)
class TickHealth:
    """Whether the tick keeps up: the last one's time, duration and adapters over budget."""

    interval_s: float
    budget_s: float
    last_at_ms: int | None = None
    last_duration_s: float | None = None
    over_budget: tuple[str, ...] = ()
    failed: str | None = None  # why the last tick failed as a whole
    pulse: Pulse = field(default_factory=Pulse)

    def ran(self, at_ms: int, duration_s: float, results: list[LinkResult]) -> None:
        self.last_at_ms, self.last_duration_s, self.failed = at_ms, duration_s, None
        self.over_budget = tuple(
            sorted({r.adapter or "?" for r in results if r.reason == BUDGET_EXCEEDED})
        )
        self.pulse.beat()

    def refused(self, reason: str) -> None:
        self.failed = reason
        self.pulse.beat(news=True)

    def news(self) -> None:
        """Something the status page shows changed (a wake's outcome): a beat shown at once."""
        self.pulse.beat(news=True)
