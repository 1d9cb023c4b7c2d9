"""From a notice opened to the gateway's acknowledgement of it.

The database is the one memory of what was delivered: a notice a sidecar opened is pending
until the gateway accepted a wake carrying it, and is then acknowledged exactly as a drain
is. So whichever path saw a notice (this process's commit, the sweep at start, or another
process's commit that the change hub heard of), the watcher is asked to be woken; the
coalescer folds the asks into at most one wake per window (claimed in the store where
several sidecars share it, :mod:`monitor.delivery.claims`); and each wake is one pass that
reads what is pending at that moment, sends it, and acknowledges what was accepted. An ask
for a notice already delivered finds nothing pending, and sends nothing.

What stays in memory is timing (each watcher's window, the passes in flight, the retry
timers) and one thing the store could not take: notices the gateway accepted whose
acknowledgement the store refused. They are acknowledged again before anything else, and
never sent again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from monitor.delivery import claims
from monitor.delivery.coalescer import WAKE_COALESCE_MS, WakeCoalescer
from monitor.delivery.timers import Handle, LoopTimers, Timers
from monitor.errors import SessionwatchError
from monitor.kernel import cursors
from monitor.kernel.changes import NoticesOpened, StoreMoved
from monitor.kernel.policy import WatchPolicy
from monitor.lazylog import LazyLogger

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.delivery.hooks import WakeAnswer
    from monitor.kernel import Kernel
    from monitor.kernel.cursors import WatchCursor
    from monitor.kernel.notices import Notice
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

log = LazyLogger(__name__)


class Sender(Protocol):
    """Who carries a notice to the gateway (:class:`monitor.delivery.hooks.HooksClient`)."""

    retry_s: float

    async def wake(self, watcher: str, text: str) -> WakeAnswer | None:
        """Send one notice; None when it is not this sender's to send."""
        ...

    def quiet_s(self) -> float:
        """How long no call may go; 0 when calls may go."""
        ...

    def say_once(self, reason: str, message: str, *args: object) -> None: ...


class Delivery:
    def __init__(
        self,
        store: StateStore,
        sender: Sender,
        *,
        timers: Timers | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.sender = sender
        self.metrics = metrics
        self.timers = timers or LoopTimers(store.clock)
        claim = self._claim if store.shared else None
        self.coalescer = WakeCoalescer(self._start_pass, timers=self.timers, claim=claim)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._retries: dict[str, Handle] = {}
        self._unacked: dict[str, list[WatchCursor]] = {}
        self._looking: asyncio.Task[None] | None = None  # a read of others' notices
        self._look_again = False

    def deliver(self, notices: list[Notice]) -> None:
        """Ask for the watchers of ``notices`` to be woken (the policy says who is)."""
        for notice in notices:
            if WatchPolicy.wakes(notice):
                self.coalescer.request(notice.watcher, notice.text)

    async def start(self, stack: AsyncExitStack, kernel: Kernel, *, others: bool = True) -> None:
        """Deliver from now on, until ``stack`` closes: the notices the kernel opens (this
        process's commits, acknowledgements that reopen one, the start-up sweep) as its
        stream publishes them, and the notices other processes open (a CLI command, another
        sidecar on a shared store): at each move of the store the hub hears, what
        ``kernel.pending`` says a sidecar opened and is pending. What was delivered already
        is no longer pending. ``others``: False to deliver this process's notices only (a
        test on a manual clock)."""
        stack.push_async_callback(self.close)
        stream = kernel.stream
        stack.callback(stream.subscribe(NoticesOpened, lambda c: self.deliver(list(c.notices))))
        if others:
            stack.callback(stream.subscribe(StoreMoved, lambda _: self._look(kernel)))
            kernel.changes.mark()  # the hub hears other processes from now on

    def _look(self, kernel: Kernel) -> None:
        """One read of what is pending at a time; moves meanwhile make one more."""
        if self._looking is not None:
            self._look_again = True
            return
        self._looking = asyncio.get_running_loop().create_task(self._pending(kernel))
        self._looking.add_done_callback(lambda _: self._looked(kernel))

    def _looked(self, kernel: Kernel) -> None:
        self._looking = None
        if self._look_again:
            self._look_again = False
            self._look(kernel)

    async def _pending(self, kernel: Kernel) -> None:
        try:
            opened = await kernel.pending()
        except SessionwatchError as exc:  # the store is away: the next move looks again
            log.debug("notices not checked: %s", exc)
            return
        self.deliver(opened)

    # -- passes --------------------------------------------------------------------------

    def _start_pass(self, watcher: str) -> None:
        """Send the watcher's undelivered notices in the background; returns at once."""
        if watcher in self._running:
            self._again.add(watcher)  # one more pass once the one in flight ends
            return
        retry = self._retries.pop(watcher, None)
        if retry is not None:
            retry.cancel()
        task = asyncio.get_running_loop().create_task(self._pass(watcher))
        self._running[watcher] = task
        task.add_done_callback(lambda _: self._passed(watcher))

    def _passed(self, watcher: str) -> None:
        self._running.pop(watcher, None)
        if watcher in self._again:
            self._again.discard(watcher)
            self._start_pass(watcher)

    def _retry_later(self, watcher: str) -> None:
        if watcher in self._retries:
            return
        delay = max(self.sender.retry_s, self.sender.quiet_s())
        self._retries[watcher] = self.timers.call_later(delay, lambda: self._retry(watcher))

    def _retry(self, watcher: str) -> None:
        self._retries.pop(watcher, None)
        self._start_pass(watcher)

    async def _pass(self, watcher: str) -> None:
        if not await self._acknowledge(watcher, self._unacked.pop(watcher, [])):
            return
        try:
            pending = await self.store.peek(
                lambda conn: cursors.list_pending(conn, watcher=watcher, opened_here=True)
            )
        except Exception as exc:  # the store is down: the notice is still there later
            self.sender.say_once("store", "could not read the notices to wake (%s); retrying", exc)
            self._retry_later(watcher)
            return
        accepted: list[WatchCursor] = []
        unsent = 0
        for cursor in pending:
            if self.sender.quiet_s() > 0:
                unsent += 1
                continue
            answer = await self.sender.wake(watcher, cursor.notice().text)
            if answer is None:
                continue  # not ours to send while the gateway refuses this key
            if answer.result == "accepted":
                accepted.append(cursor)
            else:
                unsent += 1
        if await self._acknowledge(watcher, accepted) and unsent:
            self._retry_later(watcher)

    async def _acknowledge(self, watcher: str, accepted: list[WatchCursor]) -> bool:
        """Acknowledge what the gateway accepted, exactly as a drain does (a notice that
        moved meanwhile is left alone), and deliver the fresh notice that work after the
        freeze reopens. When the store refuses, keep them to acknowledge at the next pass
        (retried), and answer False."""
        if not accepted:
            return True
        now = self.timers.now_ms()
        try:
            reopened = await self.store.write(lambda conn: cursors.acknowledge(conn, accepted, now))
        except Exception as exc:  # the store is down: the gateway has the notice already
            self._unacked[watcher] = accepted
            self.sender.say_once(
                "ack", "could not acknowledge a delivered notice (%s); retrying", exc
            )
            self._retry_later(watcher)
            return False
        if self.metrics:
            self.metrics.notices_woken.inc(len(accepted))
        self.deliver(reopened)
        return True

    async def _claim(self, watcher: str, notice: str) -> int | str:
        now = self.timers.now_ms()  # stored: wall-clock

        def run(conn: Conn) -> int | str:
            return claims.claim(conn, watcher, notice, now=now, window_ms=WAKE_COALESCE_MS)

        claimed: int | str = await self.store.write(run)
        return claimed

    # -- lifecycle -----------------------------------------------------------------------

    async def settled(self) -> None:
        """Wait until the wakes asked for so far were claimed and their passes ended (tests;
        a clean stop)."""
        await self.coalescer.settled()
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)
            await self.coalescer.settled()

    async def close(self) -> None:
        self._look_again = False  # the read being cancelled starts no other
        if self._looking is not None:
            self._looking.cancel()
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
