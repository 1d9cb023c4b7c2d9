"""Whether the tick keeps up, for the status page: the last tick's time, duration and
adapters over budget; each tick's end is published (:class:`monitor.kernel.bus.TickRan`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor.kernel.bus import Bus, TickRan
from monitor.upstream.settle import BUDGET_EXCEEDED, LinkResult


@dataclass(slots=True)
class TickHealth:
    """Whether the tick keeps up: the last one's time, duration and adapters over budget."""

    interval_s: float
    budget_s: float
    bus: Bus = field(default_factory=Bus)  # where each tick's end is said
    last_at_ms: int | None = None
    last_duration_s: float | None = None
    over_budget: tuple[str, ...] = ()
    failed: str | None = None  # why the last tick failed as a whole

    def ran(self, at_ms: int, duration_s: float, results: list[LinkResult]) -> None:
        self.last_at_ms, self.last_duration_s, self.failed = at_ms, duration_s, None
        self.over_budget = tuple(
            sorted({r.adapter or "?" for r in results if r.reason == BUDGET_EXCEEDED})
        )
        self.bus.publish(TickRan())

    def idle(self, at_ms: int) -> None:
        """A scheduled tick with nothing to read (every link quiet and watched, nothing
        moved): the links stand as the last tick left them."""
        self.last_at_ms, self.failed = at_ms, None
        self.bus.publish(TickRan(idle=True))

    def refused(self, reason: str) -> None:
        self.failed = reason
        self.bus.publish(TickRan(failed=reason))
