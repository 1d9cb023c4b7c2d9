"""From a notice opened to the gateway's acknowledgement of it: the wake ledger.

The store is the one memory of delivery, so that its promises hold across processes,
hosts, restarts and crashes (SQS's visibility timeout and the transactional outbox are the
models):

- every notice a sidecar opens has an outbox row, written in the transaction that opened
  it (:mod:`monitor.kernel.outbox`); the watch policy decides there, once, whether it is
  ever woken (``queue`` rows never are);
- a pass over a watcher holds the watcher's lease in the store (:mod:`.claims`), which
  expires: a sidecar that crashed mid-pass is taken over once its lease ran out; on SQLite,
  where one ``serve`` delivers, a restart takes its own old leases back at once;
- the window (at most one wake per watcher per :data:`WAKE_COALESCE_MS`) is stored with the
  lease, so that a restart or a peer honours it; it starts when a call goes out, and again
  when the call ends (the request may reach the gateway any time until then); in process
  it is also timed on the monotonic clock, so that a step of the wall clock never wakes
  twice within it;
- every time the ledger writes or compares (a lease's expiry, a window's start) is the
  store's clock, read in the transaction that writes or compares it: on PostgreSQL the
  server's, so no host's wall clock enters a promise between hosts; what a pass waits for
  comes back as time left, timed here on the monotonic clock;
- each call is preceded by a read of its notice, inside the lease: a notice drained or
  acknowledged meanwhile is withdrawn, never sent;
- retries are passes too: they go through the claim and the window.

A call either got an answer (accepted; or refused, failed: due again) or it did not
(``unanswered``: the gateway may have taken it). An unanswered call, or one cut by a crash,
allows exactly one more call, never more (:data:`monitor.kernel.outbox.MAX_UNANSWERED`):
the gateway drops a wake whose text equals the one still queued for the session, so a
repeat that finds the first still queued changes nothing there.

What stays in memory is timing only: the passes in flight, each watcher's next timer and
its last wake on the monotonic clock.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from typing import TYPE_CHECKING, Protocol

from monitor.clock import SECOND_MS
from monitor.delivery import claims
from monitor.delivery.shares import Lookout
from monitor.delivery.timers import Handle, LoopTimers, Timers
from monitor.errors import SessionwatchError
from monitor.kernel import outbox
from monitor.lazylog import LazyLogger
from monitor.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from contextlib import AsyncExitStack

    from monitor.delivery.hooks import WakeAnswer
    from monitor.kernel import Kernel
    from monitor.kernel.bus import Bus
    from monitor.kernel.commits import Commits
    from monitor.kernel.notices import Notice
    from monitor.kernel.outbox import OutboxRow
    from monitor.kernel.recorder import Recorder
    from monitor.metrics import Metrics

log = LazyLogger(__name__)

WAKE_COALESCE_MS = 20 * SECOND_MS
LEASE_MS = 30 * SECOND_MS  # longer than one attempt (transport.CONNECT_S + transport.READ_S)
# the longest one attempt lasts once the notice was read again (transport.READ_S: the read
# is made once connected), with a margin: a call goes only while the lease it renewed still
# covers that much
ATTEMPT_MS = 15 * SECOND_MS
STORE_RETRY_S = 0.5  # a write of the ledger the store refused: tried again from this
STORE_RETRY_CAP_S = 5.0  # ... doubling up to this, whatever the gateway's retry interval


class Sender(Protocol):
    """Who carries a notice to the gateway (:class:`monitor.delivery.hooks.HooksClient`)."""

    retry_s: float

    async def wake(
        self, watcher: str, text: str, *, still: Callable[[], Awaitable[bool]] | None = None
    ) -> WakeAnswer | None:
        """Send one notice (asking ``still`` just before each attempt); None when it is not
        this sender's to send."""
        ...

    def quiet_s(self) -> float:
        """How long no call may go; 0 when calls may go."""
        ...


class StoreRetry:
    """A write of the ledger the store refused (locked, away, full) is tried again on its
    own backoff, not on the gateway's retry interval (the gateway did nothing wrong); said
    once until the store takes one again, and its end once."""

    def __init__(self) -> None:
        self.backoff = Backoff(STORE_RETRY_S, STORE_RETRY_CAP_S)
        self.trouble = ""  # what the store last refused

    def refused(self, what: str, exc: SessionwatchError) -> float:
        """Said once until it heals; the delay before the pass tries again."""
        if not self.trouble:
            log.warning("%s (%s); the ledger tries again until the store takes it", what, exc)
        self.trouble = str(exc)
        return self.backoff.next()

    def took(self) -> None:
        """A write of the ledger went through: a refusal said before is over."""
        if self.trouble:
            log.info("the store takes the wake ledger's writes again")
            self.trouble = ""
        self.backoff.reset()


def _settling(
    entry: OutboxRow, result: str, ended_ago_ms: int | None
) -> Callable[[Recorder], claims.Settled]:
    """The transaction that records a call's outcome. An acknowledgement is named to the
    commit (delivery hears it on the bus)."""

    def run(r: Recorder) -> claims.Settled:
        settled = claims.settle(r.conn, entry, result, ended_ago_ms=ended_ago_ms)
        if settled.delivered:
            r.acknowledge(settled.reopened)
        return settled

    return run


def _capped(left_ms: int, cap_ms: int) -> float:
    """Seconds of a wait the store's clock measured, never more than ``cap_ms`` (a clock
    that stepped back does not stretch a wait), timed here on the monotonic clock."""
    return min(cap_ms, max(0, left_ms)) / 1000


class Windows:
    """Each watcher's window on this process's monotonic clock, beside the store's, so that
    a step of the wall clock never wakes twice within one. It starts as a pass's first call
    goes out, and again as each call ends (:func:`claims.settle`); ended ones are
    forgotten."""

    def __init__(self, timers: Timers, window_ms: int) -> None:
        self.timers = timers
        self.window_s = window_ms / 1000
        self.started: dict[str, float] = {}  # monotonic s

    def went(self, watcher: str, *, ended: bool = False) -> None:
        """A call to ``watcher`` goes out (the window starts unless one runs), or ``ended``."""
        now = self.timers.monotonic()
        for old in [w for w, at in self.started.items() if now - at >= self.window_s]:
            del self.started[old]
        if ended:
            self.started[watcher] = now
        else:
            self.started.setdefault(watcher, now)

    def left_s(self, watcher: str) -> float:
        """How long ``watcher``'s window still runs here (0: none)."""
        at = self.started.get(watcher)
        return 0.0 if at is None else max(0.0, at + self.window_s - self.timers.monotonic())


def holder_id() -> str:
    """This process's name in the leases: its host and pid, and a nonce for a pid reused."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Delivery:
    def __init__(
        self,
        kernel: Kernel,
        sender: Sender,
        *,
        timers: Timers | None = None,
        metrics: Metrics | None = None,
        window_ms: int = WAKE_COALESCE_MS,
        lease_ms: int = LEASE_MS,
        holder: str | None = None,
        others: bool = True,
        commits: Commits | None = None,
        host: str | None = None,
    ) -> None:
        """``others``: also deliver what other processes opened (False: this process's
        notices only, a test on a manual clock). ``commits``: what the ledger is written
        through, the kernel's unless given (a test's, on a store that refuses on cue).
        ``host``: this sidecar's host id on a store several share: it wakes its share of
        the watchers (:mod:`.shares`); None: all of them."""
        self.kernel = kernel
        self.commits = commits or kernel.commits
        self.store = self.commits.store
        self.sender = sender
        self.metrics = metrics
        self.timers = timers or LoopTimers(kernel.store.clock)
        self.window_ms = window_ms
        self.lease_ms = lease_ms
        self.holder = holder or holder_id()
        self.lookout = Lookout(self.store, self.request, host=host, others=others)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._later: dict[str, Handle] = {}  # the next pass of a watcher that must wait
        # outcomes the store refused, kept until recorded: the entry, its result, when the
        # call ended (monotonic s; None: no call went)
        self._unsettled: dict[str, list[tuple[OutboxRow, str, float | None]]] = {}
        self.windows = Windows(self.timers, window_ms)
        self._store = StoreRetry()  # a ledger write the store refused: when to try again

    def request(self, watcher: str) -> None:
        """A pass over ``watcher`` now, unless one runs (then one more after it) or one is
        already timed (the window, a lease, a retry), or the watcher is another host's
        (unless this one holds an outcome of it still to record)."""
        if not self.lookout.shares.owns(watcher) and watcher not in self._unsettled:
            return
        if watcher in self._running:
            self._again.add(watcher)
        elif watcher not in self._later:
            task = asyncio.get_running_loop().create_task(self._pass(watcher))
            self._running[watcher] = task
            task.add_done_callback(lambda t: self._passed(watcher, t))

    def deliver(self, notices: list[Notice]) -> None:
        """Ask for the watchers of ``notices`` to be woken (those the policy wakes)."""
        self.lookout.deliver(notices)

    def look(self) -> None:
        """A pass over every watcher of this host's the outbox has notices to wake for."""
        self.lookout.look()

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Deliver from now on, until ``stack`` closes: what the lookout finds due
        (:class:`.shares.Lookout`)."""
        stack.push_async_callback(self.close)
        if not self.store.shared:  # the one serve on this database: old leases were ours
            await self.commits.write(claims.release_all, small=True)
        await self.lookout.start(stack, bus)

    # -- passes --------------------------------------------------------------------------

    def _passed(self, watcher: str, task: asyncio.Task[None]) -> None:
        self._running.pop(watcher, None)
        if not task.cancelled() and task.exception() is not None:  # a bug: said, not lost
            log.error("a wake pass of %s failed", watcher, exc_info=task.exception())
        if watcher in self._again:
            self._again.discard(watcher)
            self.request(watcher)

    def _after(self, watcher: str, delay_s: float) -> None:
        """The next pass over ``watcher`` in ``delay_s`` (monotonic)."""
        if watcher in self._later:
            return
        self._again.discard(watcher)  # that pass will see whatever was asked meanwhile

        def fire() -> None:
            self._later.pop(watcher, None)
            self.request(watcher)

        self._later[watcher] = self.timers.call_later(max(0.0, delay_s), fire)

    async def _pass(self, watcher: str) -> None:
        if not await self._settle_kept(watcher):  # a record is no wake: not held by the window
            self._after(watcher, self._store.backoff.next())
            return
        left = self.windows.left_s(watcher)
        if left > 0:  # within the window on this process's monotonic clock
            self._after(watcher, left)
            return
        try:
            got = await self.commits.write(
                lambda conn: claims.claim(
                    conn,
                    watcher,
                    holder=self.holder,
                    window_ms=self.window_ms,
                    lease_ms=self.lease_ms,
                ),
                small=True,  # each step of a pass is a few rows: inline when it may be
            )
        except SessionwatchError as exc:  # the store is down: the notices are still there
            self._after(watcher, self._store.refused("could not claim a wake", exc))
            return
        self._store.took()
        if isinstance(got, claims.Busy):  # another holder: once its lease has run out
            self._after(watcher, _capped(got.left_ms, self.lease_ms) + 0.05)
        elif isinstance(got, claims.Wait):
            self._after(watcher, _capped(got.left_ms, self.window_ms))
        elif got is not None:
            if got.repeats and self.metrics:
                self.metrics.wake_repeats.labels("taken_over").inc(got.repeats)
            self._gave_up(got.settled)
            self.deliver(got.reopened)
            if got.entries:
                await self._send(watcher, got.entries)

    async def _send(self, watcher: str, entries: list[OutboxRow]) -> None:
        """Each claimed notice in its own call, while the lease holds; then the lease ends."""
        again = again_now = store_again = False
        try:
            for entry in entries:
                if self.sender.quiet_s() > 0:
                    again = True
                    break
                held: list[claims.Hold] = []
                answer = await self.sender.wake(watcher, entry.text, still=self._still(entry, held))
                ended = self.timers.monotonic() if "go" in held else None
                if ended is not None:  # a call went: the window runs from its end
                    self.windows.went(watcher, ended=True)
                if held and held[-1] == "lost":  # claimed again: by us, or Busy
                    again_now = True
                    break
                if answer is None and held and held[-1] == "go":
                    await self._settle(entry, "refused", ended=None)  # not ours after all
                if answer is None or answer.result == "withdrawn":
                    continue  # not ours to send, or no longer pending: no call made
                if not await self._settle(entry, answer.result, ended=ended):
                    store_again = True  # the store refused the record, not the gateway
                    break
                if answer.result != "accepted":
                    again = True
                    break  # the gateway is not taking wakes: the rest wait for the retry
        finally:
            if watcher not in self._unsettled:  # else it keeps the notice until recorded
                await self._release(watcher)
        if again_now:
            self._again.add(watcher)  # when this pass has ended
        elif store_again:
            self._after(watcher, self._store.backoff.next())
        elif again:
            self._after(watcher, max(self.sender.retry_s, self.sender.quiet_s()))

    async def _settle(self, entry: OutboxRow, result: str, *, ended: float | None) -> bool:
        """Record a call's outcome; the call ``ended`` then (monotonic s; None when no call
        went after all). When the store refuses, it is kept here and recorded before the
        next claim (the lease keeps the notice meanwhile): a wake the gateway accepted is
        never sent again for want of its acknowledgement, unless this process dies first
        (then the taker's one repeat). False when it was kept."""
        ago_ms = None if ended is None else int((self.timers.monotonic() - ended) * 1000)
        try:
            settled = await self.commits.commit(_settling(entry, result, ago_ms), small=True)
        except SessionwatchError as exc:
            self._unsettled.setdefault(entry.watcher, []).append((entry, result, ended))
            self._store.refused("could not record a wake's outcome", exc)
            return False
        self._store.took()
        if settled.delivered:
            if result != "accepted":
                self._gave_up([entry])
            elif self.metrics:
                self.metrics.notices_woken.inc()
        elif settled.repeat and self.metrics:
            self.metrics.wake_repeats.labels("unanswered").inc()
        return True

    async def _settle_kept(self, watcher: str) -> bool:
        """The outcomes the store refused before, recorded first; False if it still
        refuses."""
        kept = self._unsettled.pop(watcher, [])
        for at, (entry, result, ended) in enumerate(kept):
            if not await self._settle(entry, result, ended=ended):
                self._unsettled[watcher] = self._unsettled.pop(watcher, []) + kept[at + 1 :]
                return False
        if kept:  # the lease kept the notices until recorded: a peer may take the watcher
            await self._release(watcher)
        return True

    def _still(self, entry: OutboxRow, held: list[claims.Hold]) -> Callable[[], Awaitable[bool]]:
        """What the sender asks before each attempt: :func:`claims.hold`, its answers
        appended to ``held``."""

        async def still() -> bool:
            began = self.timers.monotonic()
            try:
                answer: claims.Hold = await self.commits.write(
                    lambda conn: claims.hold(
                        conn,
                        entry,
                        holder=self.holder,
                        lease_ms=self.lease_ms,
                        window_ms=self.window_ms,
                    ),
                    small=True,
                )
            except SessionwatchError:
                answer = "lost"  # unconfirmed: not sent; the pass claims again
            took_ms = (self.timers.monotonic() - began) * 1000
            if answer == "go" and took_ms > self.lease_ms - ATTEMPT_MS:
                # the store was so slow that the lease may run out before the call ends,
                # and another sidecar take the notice over while it is in flight: not sent,
                # due again as it was (no call went), and the pass claims again
                await self._settle(entry, "refused", ended=None)
                answer = "lost"
            if answer == "go":
                self.windows.went(entry.watcher)  # as the pass's first call goes out
            if answer == "theirs":
                log.info(
                    "%s: not woken for %s: the gateway queued and woke it itself when it"
                    " started (its sweep of pending notices)",
                    entry.watcher,
                    entry.target,
                )
            held.append(answer)
            return answer == "go"

        return still

    async def _release(self, watcher: str) -> None:
        try:
            await self.commits.write(
                lambda conn: claims.release(conn, watcher, self.holder), small=True
            )
        except SessionwatchError as exc:  # it expires on its own
            log.debug("a wake lease was not released: %s", exc)

    def _gave_up(self, entries: list[OutboxRow]) -> None:
        for entry in entries:
            log.warning(
                "the wake of %s for %s went %d times without an answer: counted as"
                " delivered, not sent again",
                entry.watcher,
                entry.target,
                outbox.MAX_UNANSWERED,
            )

    # -- lifecycle -----------------------------------------------------------------------

    async def settled(self) -> None:
        """Wait until the passes asked for so far ended (tests; a clean stop)."""
        while self._running or self.lookout.looking is not None:
            looking = self.lookout.looking
            tasks = [*self._running.values(), *([looking] if looking else [])]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        self.lookout.close()
        for handle in self._later.values():
            handle.cancel()
        self._later.clear()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
