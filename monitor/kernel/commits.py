"""The one writer: every write transaction of the service, and what each one changed, said
once on the bus.

:class:`Commits` runs a transaction through a :class:`Recorder` (every event is recorded
that way, whoever records it), then publishes :class:`StoreWritten` and what the
transaction named (the notices its events or it opened or acknowledged, the watches), counts
what was recorded and runs retention when it is due. A transaction that failed publishes
nothing. Inside the transaction, it tells the store the same facts as topics, for the other
processes sharing it (:mod:`monitor.kernel.topics`). The kernel and its parts (the
gateway's sessions, retention) and delivery's ledger commit through the one instance the
kernel holds: none of them calls the store's ``write`` (tests/test_layers.py checks it).
"""

from __future__ import annotations

from monitor.kernel.bus import (
    NoticesAcknowledged,
    NoticesOpened,
    StoreWritten,
    WatchesChanged,
)
from monitor.kernel.policy import WatchPolicy
from monitor.kernel.recorder import Recorder
from monitor.kernel.retention import Retention
from monitor.kernel.topics import EVENTS, LINKS, NOTICES, wake

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from monitor.kernel.bus import Bus
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

    T = TypeVar("T")

_WRITTEN = StoreWritten()  # one for every commit: it holds nothing


class Commits:
    """Write transactions on ``store``, routed by ``policy``; their changes on ``bus``."""

    def __init__(
        self, store: StateStore, policy: WatchPolicy, bus: Bus, metrics: Metrics | None = None
    ) -> None:
        self.store = store
        self.policy = policy
        self.bus = bus
        self.retention = Retention(self.write, store.clock)
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
            result = fn(recorder)
            if self.store.shared:  # for the other hosts (SQLite's version carries no topic)
                self.store.announce(conn, _topics(recorder))
            return result

        result = await self.store.write(run, small=small)
        self._observe(recorder)
        if recorder.recorded and self.retention.due(now):  # the hot path awaits nothing more
            await self.retention.when_due(now)
        return result

    async def write(self, fn: Callable[[Conn], T], *, small: bool = False) -> T:
        """A write transaction that records no event and names no change but itself."""
        return await self.commit(lambda r: fn(r.conn), small=small)

    def _observe(self, recorder: Recorder) -> None:
        """After a commit: count what was recorded, and publish what it changed."""
        self.bus.publish(_WRITTEN)  # whatever it wrote (a link, a lease, a mark)
        fresh = recorder.fresh()
        if self.metrics:
            for r in fresh:
                self.metrics.recorded(r.event.kind, len(r.notices))
        opened = recorder.all_opened(fresh)
        if recorder.acknowledged is not None:
            self.bus.publish(NoticesAcknowledged(tuple(recorder.acknowledged)))
        if opened:
            self.bus.publish(NoticesOpened(tuple(opened)))
        if recorder.watches_changed:
            self.bus.publish(WatchesChanged())
        for change in recorder.said:
            self.bus.publish(change)


def _topics(recorder: Recorder) -> frozenset[str]:
    """What the transaction ``recorder`` ran touched, as another process acts on it: the
    facts :meth:`Commits._observe` publishes here once it committed."""
    fresh = recorder.fresh()
    opened = recorder.all_opened(fresh)
    topics = {wake(n.watcher) for n in opened if WatchPolicy.wakes(n)}
    topics |= {change.topic for change in recorder.said if change.topic}
    if fresh:
        topics.add(EVENTS)
    if opened or recorder.acknowledged is not None:
        topics.add(NOTICES)
    if recorder.watches_changed:
        topics.add(LINKS)
    return frozenset(topics)
