"""After a commit: count what was recorded, and wake whom its notices concern.

Each notice is woken once, whichever path saw it first: this process's commit
(:meth:`Delivery.observe`), or the service's notice watcher after another process's
(:meth:`Delivery.deliver` with what :func:`cursors.list_pending` shows). Whom a notice wakes
is the policy's (:meth:`WatchPolicy.wakes`); when, the coalescer's; on a store several
sidecars share, each wake is claimed in the store first (:mod:`monitor.kernel.wakes`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from monitor.kernel import cursors, wakes
from monitor.kernel.cursors import WatchCursor
from monitor.kernel.notices import WAKE_COALESCE_MS, Notice, WakeCallback, WakeCoalescer
from monitor.kernel.policy import WatchPolicy
from monitor.kernel.signal_log import Recorded

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

DELIVERED_MEMORY = 4096  # notices remembered as delivered (each is woken once)


class Delivery:
    def __init__(
        self,
        store: StateStore,
        policy: WatchPolicy,
        *,
        wake: WakeCallback | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        claim = self._claim if store.shared else None
        self.waker = WakeCoalescer(wake, clock=store.clock, claim=claim) if wake else None
        self._delivered: OrderedDict[tuple[str, str | None, str], None] = OrderedDict()

    def observe(self, recorded: list[Recorded]) -> None:
        fresh = [r for r in recorded if not r.duplicate]
        if self.metrics:
            for r in fresh:
                self.metrics.recorded(r.event.kind, len(r.notices))
        self.deliver([n for r in fresh for n in r.notices])

    def deliver(self, notices: list[Notice]) -> None:
        if self.waker is None:
            return
        for notice in notices:
            key = (notice.watcher, notice.target, notice.text)
            if key in self._delivered:
                continue
            self._delivered[key] = None
            if len(self._delivered) > DELIVERED_MEMORY:
                self._delivered.popitem(last=False)
            if self.policy.wakes(notice):
                self.waker.request(notice.watcher, f"{notice.target}\n{notice.text}")

    async def undelivered(self, watcher: str) -> list[WatchCursor]:
        """The watcher's pending notices that a sidecar opened: what a wake carries."""
        return await self.store.peek(
            lambda conn: cursors.list_pending(conn, watcher=watcher, opened_here=True)
        )

    async def delivered(self, accepted: list[WatchCursor]) -> None:
        """The gateway accepted a wake carrying these notices: acknowledge them exactly as a
        drain does (a notice that moved meanwhile is left alone), and deliver the fresh notice
        that work after the freeze reopens."""
        now = self.store.clock()
        reopened: list[Notice] = []

        def run(conn: Conn) -> None:
            reopened[:] = cursors.acknowledge(conn, accepted, now)

        await self.store.write(run)
        if self.metrics:
            self.metrics.notices_woken.inc(len(accepted))
        self.deliver(reopened)

    async def settled(self) -> None:
        """Wait until the wakes requested so far were claimed (and sent, if ours)."""
        if self.waker is not None:
            await self.waker.settled()

    async def _claim(self, watcher: str, notice: str) -> int | str:
        now = self.store.clock()
        claimed: int | str = await self.store.write(
            lambda conn: wakes.claim(conn, watcher, notice, now=now, window_ms=WAKE_COALESCE_MS)
        )
        return claimed
