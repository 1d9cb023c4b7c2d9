"""The kernel's write transactions, and what each one changed, said once on the bus.

:class:`Commits` runs a transaction through a :class:`Recorder` (every event is recorded
that way, whoever records it), then counts what was recorded, publishes what changed and
runs retention when it is due. The kernel and its parts (the gateway's sessions, delivery
through :meth:`Kernel.acknowledged`) commit through the one instance the kernel holds: none
of them holds the kernel.
"""

from __future__ import annotations

from monitor.kernel.bus import (
    EventsRecorded,
    NoticesAcknowledged,
    NoticesOpened,
    StoreWritten,
    WatchesChanged,
)
from monitor.kernel.recorder import Recorder

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from monitor.kernel.bus import Bus
    from monitor.kernel.notices import Notice
    from monitor.kernel.policy import WatchPolicy
    from monitor.kernel.retention import Retention
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

    T = TypeVar("T")

_WRITTEN = StoreWritten()  # one for every commit: it holds nothing


class Commits:
    """Write transactions on ``store``, routed by ``policy``; their changes on ``bus``."""

    def __init__(
        self,
        store: StateStore,
        policy: WatchPolicy,
        bus: Bus,
        retention: Retention,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.bus = bus
        self.retention = retention
        self.metrics = metrics

    async def commit(
        self, fn: Callable[[Recorder], T], *, small: bool = False, now: int | None = None
    ) -> T:
        """Run ``fn`` as one write transaction (``recorder.conn``): the events it records
        through the recorder commit with whatever else it writes, and are observed after.
        ``small``: one event, which the store may run inline; ``now``: the caller's time,
        when it has read the clock already."""
        now = self.store.clock() if now is None else now
        recorder = Recorder(now, self.policy)

        def run(conn: Conn) -> T:
            recorder.begin(conn)
            return fn(recorder)

        result = await self.store.write(run, small=small)
        self.bus.publish(_WRITTEN)  # whatever it wrote (a link, a lease, a mark)
        if recorder.recorded:
            self._observe(recorder)
            if self.retention.due(now):  # the hot path awaits nothing more
                await self.retention.when_due(now)
        return result

    def _observe(self, recorder: Recorder) -> None:
        """After a commit: count what was recorded, and publish what it changed."""
        fresh = [r for r in recorder.recorded if not r.duplicate]
        if not fresh:
            return
        if self.metrics:
            for r in fresh:
                self.metrics.recorded(r.event.kind, len(r.notices))
        if self.bus.wants(EventsRecorded):  # the hot path builds nothing for no one
            self.bus.publish(EventsRecorded(tuple(fresh)))
        self.opened([n for r in fresh for n in r.notices])
        if recorder.watches_changed:
            self.watches_changed()

    def opened(self, notices: list[Notice]) -> None:
        """Notices opened outside :meth:`commit` (reopened, or found at start-up)."""
        if notices:
            self.bus.publish(NoticesOpened(tuple(notices)))

    def acknowledged(self, reopened: list[Notice]) -> None:
        """After a commit that acknowledged notices (``outbox.acknowledge``: a drain, a wake
        the gateway accepted), whichever part made it: what is pending changed, and the
        notices the acknowledgement reopened (work that came after a notice froze) are
        opened, for delivery and the readers alike."""
        self.bus.publish(NoticesAcknowledged(tuple(reopened)))
        self.opened(reopened)

    def watches_changed(self) -> None:
        """Which sessions are watched may have changed (a watch, a reset, a deletion)."""
        self.bus.publish(WatchesChanged())
