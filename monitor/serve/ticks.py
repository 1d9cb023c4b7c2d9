"""The tick schedule and the early checks: one component.

The fixed tick is the source of truth: ``initial_delay_s`` after start, then on a grid of
``interval_s``, timed on the loop's monotonic clock. A reloaded interval applies from the
next tick (:meth:`Ticks.reschedule`: the wait in course is measured again from the last
tick). Never two at once: a tick due while one runs (a slow one, an early check) is
skipped and said once, and the ticks a slow one ran past are one skip, not a queue.

Early checks: file watching and node watching publish :class:`SourcesMoved` on the change
stream; the keys due are gathered while a check runs, and checked in one go after it. A
check that stopped at the scan cap with more written makes its keys due again at once, so
a prompt behind a burst of output waits for no tick, and other keys due take their turn
between two reads of the burst. Keys moved by a database's WAL write (OpenCode's) are
checked again :data:`SETTLE_MS` after the last one: SQLite makes a commit visible to
readers a moment after it writes the frames, and a check at once can come before. A check
whose links went missing publishes :class:`WatchedMayDiffer` (unless it was a watch's own
catch-up check), so the watches are armed again for their directories.

Gaining the links without a host (:class:`OwnershipChanged`: their holder died) runs a full
tick at once, and the schedule goes on from it.

A scheduled tick with nothing to read is left out: nothing moved since the last full tick
began (no source written, no link, watch, ownership or configuration changed, no other
process's commit), every link it checked was quiet, and a live inotify watch hears every one of them
(:class:`SourcesWatched`, from file watching), so a write would have woken an early check.
One scheduled tick in :data:`FULL_EVERY` is full whatever was heard: a quiet link's scan
time is stamped then, and a link whose source no watch hears (a node's, one without a file)
keeps every tick full.

Stopping cancels the schedule, never a tick in flight: the ticker's ``done`` waits
for it on the way out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from typing import TYPE_CHECKING

from monitor.errors import SessionwatchError
from monitor.kernel.bus import (
    Bus,
    ConfigReloaded,
    OwnershipChanged,
    SourcesMoved,
    SourcesWatched,
    TickRan,
    WatchedMayDiffer,
)
from monitor.serve.components import LINK_CHANGES, start_task
from monitor.upstream.settle import BUDGET_EXCEEDED, LinkResult

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.config import Config
    from monitor.kernel import Kernel
    from monitor.metrics import Metrics
    from monitor.upstream import UpstreamMonitor

log = logging.getLogger(__name__)

# after a database's WAL was written, its keys are checked again these ms after the last
# write: the commit is visible to readers a moment after its frames (the WAL index follows)
SETTLE_MS = (25, 100, 400)
# one scheduled tick in this many is full, whatever was heard: the others find nothing to
# read when nothing moved since the last full one, every link then quiet and heard
FULL_EVERY = 10


class Ticks:
    def __init__(
        self,
        kernel: Kernel,
        monitor: UpstreamMonitor,
        metrics: Metrics,
        *,
        interval_s: float,
        initial_delay_s: float,
    ) -> None:
        """Each tick's end is said on the bus (:class:`TickRan`, with its time and
        duration: the status page shows them)."""
        self.kernel = kernel
        self.bus = kernel.bus
        self.monitor = monitor
        self.metrics = metrics
        self.interval_s = interval_s
        self.initial_delay_s = initial_delay_s
        self._stopped = False  # the stack closed: no early check starts anew
        self._rescheduled = asyncio.Event()
        self._skip_logged = False
        self._due: set[str] = set()  # keys whose sources moved, for the next early check
        self._rearm = False  # whether a missing source among them re-arms the watches
        self._early: asyncio.Task[None] | None = None
        self._settling: set[str] = set()  # keys whose database may not show its commit yet
        self._heard: dict[str, frozenset[str]] = {}  # per watcher, the links it hears
        self._quiet: frozenset[str] | None = None  # the last full tick's, when all were quiet
        self._moved = True  # something moved since the last full tick began
        self._now_due = False  # a tick is due at once (ownership gained)
        self._left = 0  # scheduled ticks left out in a row
        self._settle_timers: list[asyncio.TimerHandle] = []

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        stack.push_async_callback(self.monitor.ticker.done)  # last: the tick in flight ends
        stack.callback(self._stop)
        stack.enter_context(bus.subscribe(SourcesMoved, self._moved_sources))
        stack.enter_context(bus.subscribe(SourcesWatched, self._watched))
        stack.enter_context(bus.subscribe(LINK_CHANGES, self._changed))
        stack.enter_context(bus.subscribe(OwnershipChanged, self._owned))
        stack.callback(self._cancel_settling)
        stack.enter_context(
            bus.subscribe(ConfigReloaded, lambda c: self.reschedule(c.new.monitor.interval_s))
        )
        start_task(stack, self.on_schedule())

    def _stop(self) -> None:
        self._stopped = True

    def _owned(self, change: OwnershipChanged) -> None:
        """The links without a host became ours (their holder died, say): a full tick at
        once, not at the next interval."""
        if change.shared:
            self._now_due = True
            self._rescheduled.set()

    def live_fields(self, new: Config) -> tuple[str, ...]:
        """The interval applies live, from the next tick."""
        return ("monitor.interval_s",)

    def reschedule(self, interval_s: float) -> None:
        """A new interval (a reload): it applies from the next tick."""
        if interval_s != self.interval_s:
            log.info("the tick's interval is now %g s, from the next tick", interval_s)
        self.interval_s = interval_s
        self._rescheduled.set()

    async def on_schedule(self) -> None:
        """The fixed tick (see the module docstring)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.initial_delay_s
        last: float | None = None  # when the last tick started
        while True:  # until the stack cancels it
            if await self._interrupted(due - loop.time()):
                if self._now_due:  # now, then on the grid from there
                    self._now_due = False
                    due = loop.time()
                elif last is not None:
                    due = last + self.interval_s
                continue
            last = loop.time()
            ran = False
            try:
                ran = await asyncio.shield(asyncio.ensure_future(self.scheduled_tick()))
            except Exception:  # a bug in one tick must not end the ticks: said, and on
                log.exception("a tick failed unexpectedly; the next one runs as planned")
            interval = self.interval_s
            due += interval
            if due < loop.time():  # it ran past its next time: those ticks are skipped
                self._say_skipped()
                due += math.ceil((loop.time() - due) / interval) * interval
            elif ran:  # a tick that ran, took its writes and kept up: a skip is news again
                self._skip_logged = False

    async def _interrupted(self, wait_s: float) -> bool:
        """Wait ``wait_s``; True when the schedule changed meanwhile."""
        try:
            await asyncio.wait_for(self._rescheduled.wait(), max(0.0, wait_s))
        except TimeoutError:
            return False
        self._rescheduled.clear()
        return True

    def _say_skipped(self) -> None:
        if not self._skip_logged:
            log.warning("the previous tick is still running; skipping ticks until it ends")
            self._skip_logged = True

    async def scheduled_tick(self) -> bool:
        """The fixed tick; whether it ran and the store took its writes. One still running
        (waiting for a locked database, an early check) is not queued behind: this one is
        skipped, said once until a tick runs and keeps up (:meth:`on_schedule`). One with
        nothing to read is left out (:meth:`_nothing_to_read`)."""
        if self.monitor.ticker.busy:
            self._say_skipped()
            return False
        if self._nothing_to_read():
            self._left += 1
            self.bus.publish(TickRan(int(time.time() * 1000), idle=True))
            return True
        self._moved, self._left = False, 0
        return await self.run_tick()

    def _nothing_to_read(self) -> bool:
        """Nothing moved since the last full tick began (no source, link, watch, other
        process's commit or configuration), every link it checked was quiet, and every one
        of them is heard by a live watch (inotify: a write wakes an early check at once);
        and the last :data:`FULL_EVERY` ticks were not all left out."""
        if self._moved or self._quiet is None or self._left >= FULL_EVERY - 1:
            return False
        return self._quiet <= frozenset().union(*self._heard.values())

    def _watched(self, change: SourcesWatched) -> None:
        self._heard[change.by] = change.keys

    def _changed(self, _: object) -> None:
        self._moved = True

    # -- early checks --------------------------------------------------------------------

    def _moved_sources(self, change: SourcesMoved) -> None:
        self._moved = True
        self._due |= change.keys
        self._rearm = self._rearm or not change.catch_up
        if change.settling:
            self._settle(change.keys)
        if self._early is None:
            self._early = asyncio.get_running_loop().create_task(self._check_due())

    def _settle(self, keys: frozenset[str]) -> None:
        """Check ``keys`` again :data:`SETTLE_MS` after their database's last write: the
        check at once may have run before the commit was visible (and a message then found
        without its parts is looked at again). Each write starts the series again."""
        self._settling |= keys
        self._cancel_settling()
        loop = asyncio.get_running_loop()
        last = len(SETTLE_MS) - 1
        self._settle_timers = [
            loop.call_later(ms / 1000, self._settled, i == last) for i, ms in enumerate(SETTLE_MS)
        ]

    def _settled(self, last: bool) -> None:
        keys = frozenset(self._settling)
        if last:
            self._settling.clear()
        if keys and not self._stopped:
            self._moved_sources(SourcesMoved(keys, catch_up=True))

    def _cancel_settling(self) -> None:
        for timer in self._settle_timers:
            timer.cancel()
        self._settle_timers = []

    async def _check_due(self) -> None:
        """The keys due, in one check at a time, until none is due (never cancelled: the
        exit stack waits for the tick in flight)."""
        try:
            while self._due and not self._stopped:
                keys, rearm = self._due, self._rearm
                self._due, self._rearm = set(), False
                try:
                    await self.run_tick(keys, rearm=rearm)
                except Exception:
                    log.exception("an early check failed")
        finally:
            self._early = None

    # -- one tick ------------------------------------------------------------------------

    async def run_tick(self, only: set[str] | None = None, *, rearm: bool = True) -> bool:
        """One tick (of the ``only`` keys, an early check); whether the store took all it
        had to write."""
        start = time.perf_counter()
        try:
            results = await self.monitor.tick(only)
        except SessionwatchError as exc:
            log.warning("tick failed: %s", exc)
            self.bus.publish(TickRan(int(time.time() * 1000), failed=str(exc)))
            if only is None:
                self._quiet = None  # it read nothing: the next one is full
            return False
        whole = only is None  # a whole tick: the links as they stand now
        self.bus.publish(self._report(results, time.perf_counter() - start, whole=whole))
        if whole:
            quiet = all(r.outcome == "quiet" for r in results)
            self._quiet = frozenset(r.session_key for r in results) if quiet else None
        if rearm and any(r.outcome == "missing" for r in results):
            self.bus.publish(WatchedMayDiffer())
        more = frozenset(r.session_key for r in results if r.more and not r.unsettled)
        if more:  # stopped at the scan cap: the rest now, in turn with the other keys due
            self._moved_sources(SourcesMoved(more, catch_up=True))
        return not any(r.unsettled for r in results)

    def _report(self, results: list[LinkResult], duration: float, *, whole: bool) -> TickRan:
        """A tick's metrics (the links by outcome, after a whole one) and its log lines (a
        change each: turns recorded; states say themselves); what it ran, to publish."""
        self.metrics.ticks.inc()
        self.metrics.tick_seconds.observe(duration)
        counted = Counter((r.adapter or "none", r.outcome) for r in results)
        for (adapter, outcome), n in counted.items():
            self.metrics.outcomes.labels(adapter, outcome).inc(n)
        for r in results:
            if r.outcome == "activity" and not r.unsettled:
                turns = "1 turn" if r.turns == 1 else f"{r.turns} turns"
                log.info(
                    "%s: %s recorded%s", r.session_key, turns, f" ({r.reason})" * bool(r.reason)
                )
        if whole:
            self.metrics.links_now.clear()
            for (adapter, outcome), n in counted.items():
                self.metrics.links_now.labels(adapter, outcome).set(n)
        over = sorted({r.adapter or "?" for r in results if r.reason == BUDGET_EXCEEDED})
        return TickRan(int(time.time() * 1000), duration, over_budget=tuple(over))
