"""The tick schedule and the early checks: one component.

The fixed tick is the source of truth: ``initial_delay_s`` after start, then on a grid of
``interval_s``, timed on a monotonic clock. A reloaded interval applies from the
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

The pieces, each on its own and on the injected :class:`~monitor.delivery.timers.Timers`
(the loop's in the service, a manual one in a test): :class:`IdleRule` (frozen: what was
heard gives a new rule), :class:`Schedule` (the grid, as plain arithmetic on times),
:class:`EarlyChecks` (the keys due and their settling) and :func:`report` (a tick's metrics
and log lines, and what it ran). :class:`Ticks` joins them to the bus and the ticker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from monitor.errors import SessionwatchError
from monitor.kernel.bus import (
    Bus,
    Change,
    ConfigReloaded,
    DoingChanged,
    OwnershipChanged,
    SourcesMoved,
    SourcesWatched,
    TickRan,
    WatchedMayDiffer,
)
from monitor.serve.components import LINK_CHANGES, links_may_differ, start_task
from monitor.upstream.settle import BUDGET_EXCEEDED, LinkResult

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.config import Config
    from monitor.delivery.timers import Handle, Timers
    from monitor.metrics import Metrics
    from monitor.upstream.tick import Ticker

log = logging.getLogger(__name__)

# after a database's WAL was written, its keys are checked again these ms after the last
# write: the commit is visible to readers a moment after its frames (the WAL index follows)
SETTLE_MS = (25, 100, 400)
# one scheduled tick in this many is full, whatever was heard: the others find nothing to
# read when nothing moved since the last full one, every link then quiet and heard
FULL_EVERY = 10


def _none_heard() -> Mapping[str, frozenset[str]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class IdleRule:
    """Whether a scheduled tick has nothing to read, as a value: each change heard, each
    tick begun, left out or ended gives a new rule (see the module docstring)."""

    moved: bool = True  # something moved since the last full tick began
    quiet: frozenset[str] | None = None  # the last full tick's links, when all were quiet
    watched: Mapping[str, frozenset[str]] = field(default_factory=_none_heard)  # per watcher
    left: int = 0  # scheduled ticks left out in a row

    def heard(self, change: Change) -> IdleRule:
        """A watcher's set of links heard (:class:`SourcesWatched`) replaces its last;
        anything else heard moved (a source, a link, a watch, the configuration)."""
        if isinstance(change, SourcesWatched):
            watched = MappingProxyType({**self.watched, change.by: change.keys})
            return replace(self, watched=watched)
        return replace(self, moved=True)

    def skip(self) -> bool:
        """Nothing moved since the last full tick began, every link it checked was quiet,
        and every one of them is heard by a live watch; and the last :data:`FULL_EVERY`
        ticks were not all left out."""
        if self.moved or self.quiet is None or self.left >= FULL_EVERY - 1:
            return False
        return self.quiet <= frozenset().union(*self.watched.values())

    def left_out(self) -> IdleRule:
        return replace(self, left=self.left + 1)

    def began(self) -> IdleRule:
        """A full tick begins: what moves from now on is news to the next."""
        return replace(self, moved=False, left=0)

    def ended(self, results: list[LinkResult] | None) -> IdleRule:
        """A full tick's links as it found them (None: it failed, and read nothing)."""
        quiet = results is not None and all(r.outcome == "quiet" for r in results)
        keys = frozenset(r.session_key for r in results or ())
        return replace(self, quiet=keys if quiet else None)


@dataclass(frozen=True)
class Schedule:
    """The grid: ``initial_delay_s`` after start, then every ``interval_s``, as arithmetic
    on a monotonic clock's seconds."""

    interval_s: float
    initial_delay_s: float

    def first(self, now: float) -> float:
        return now + self.initial_delay_s

    def after(self, due: float, now: float) -> tuple[float, bool]:
        """The next time due after the tick due at ``due`` ended at ``now``, and whether it
        ran past ticks (those are skipped: one skip, not a queue)."""
        due += self.interval_s
        if due >= now:
            return due, False
        return due + math.ceil((now - due) / self.interval_s) * self.interval_s, True

    def moved(self, last: float | None, due: float) -> float:
        """The time due once the interval changed: measured again from the last tick."""
        return due if last is None else last + self.interval_s


class EarlyChecks:
    """The keys whose sources moved, checked in one go at a time (``check(keys, rearm)``)
    until none is due; a database's keys again :data:`SETTLE_MS` after its last write."""

    def __init__(
        self, timers: Timers, check: Callable[[set[str], bool], Awaitable[object]]
    ) -> None:
        self.timers = timers
        self.check = check
        self.stopped = False  # no check starts anew
        self._due: set[str] = set()
        self._rearm = False  # whether a missing source among them re-arms the watches
        self._running: asyncio.Task[None] | None = None
        self._settling: set[str] = set()  # keys whose database may not show its commit yet
        self._timers: list[Handle] = []

    def moved(self, change: SourcesMoved) -> None:
        self._due |= change.keys
        self._rearm = self._rearm or not change.catch_up
        if change.settling:
            self._settle(change.keys)
        if self._running is None and not self.stopped:
            self._running = asyncio.get_running_loop().create_task(self._check_due())

    def stop(self) -> None:
        self.stopped = True
        self.cancel_settling()

    def _settle(self, keys: frozenset[str]) -> None:
        """Check ``keys`` again :data:`SETTLE_MS` after their database's last write: the
        check at once may have run before the commit was visible (and a message then found
        without its parts is looked at again). Each write starts the series again."""
        self._settling |= keys
        self.cancel_settling()
        last = len(SETTLE_MS) - 1
        self._timers = [
            self.timers.call_later(ms / 1000, functools.partial(self._settled, i == last))
            for i, ms in enumerate(SETTLE_MS)
        ]

    def _settled(self, last: bool) -> None:
        keys = frozenset(self._settling)
        if last:
            self._settling.clear()
        if keys and not self.stopped:
            self.moved(SourcesMoved(keys, catch_up=True))

    def cancel_settling(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []

    async def _check_due(self) -> None:
        """The keys due, in one check at a time, until none is due (never cancelled: the
        exit stack waits for the tick in flight)."""
        try:
            while self._due and not self.stopped:
                keys, rearm = self._due, self._rearm
                self._due, self._rearm = set(), False
                try:
                    await self.check(keys, rearm)
                except Exception:
                    log.exception("an early check failed")
        finally:
            self._running = None


def _end(wait: asyncio.Future[None]) -> None:
    if not wait.done():
        wait.set_result(None)


def report(
    metrics: Metrics, results: list[LinkResult], *, at_ms: int, duration_s: float, whole: bool
) -> TickRan:
    """A tick's metrics (the links by outcome, after a whole one) and its log lines (a
    change each: turns recorded; states say themselves); what it ran, to publish."""
    metrics.ticks.inc()
    metrics.tick_seconds.observe(duration_s)
    counted = Counter((r.adapter or "none", r.outcome) for r in results)
    for (adapter, outcome), n in counted.items():
        metrics.outcomes.labels(adapter, outcome).inc(n)
    for r in results:
        if r.outcome == "activity" and not r.unsettled:
            turns = "1 turn" if r.turns == 1 else f"{r.turns} turns"
            log.info("%s: %s recorded%s", r.session_key, turns, f" ({r.reason})" * bool(r.reason))
    if whole:
        metrics.links_now.clear()
        for (adapter, outcome), n in counted.items():
            metrics.links_now.labels(adapter, outcome).set(n)
    over = sorted({r.adapter or "?" for r in results if r.reason == BUDGET_EXCEEDED})
    return TickRan(at_ms, duration_s, over_budget=tuple(over))


class Ticks:
    """The schedule and the early checks of one ticker, on ``timers``; each tick's end is
    said on the bus (:class:`TickRan`, with its time and duration: the status page shows
    them)."""

    bus: Bus  # handed at start

    def __init__(
        self,
        ticker: Ticker,
        metrics: Metrics,
        timers: Timers,
        *,
        interval_s: float,
        initial_delay_s: float,
    ) -> None:
        self.ticker = ticker
        self.metrics = metrics
        self.timers = timers
        self.schedule = Schedule(interval_s, initial_delay_s)
        self.idle = IdleRule()
        self.early = EarlyChecks(timers, lambda keys, rearm: self.run_tick(keys, rearm=rearm))
        self._rescheduled = False
        self._now_due = False  # a tick is due at once (ownership gained)
        self._wake: asyncio.Future[None] | None = None  # the schedule's wait in course
        self._skip_logged = False

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.bus = bus
        stack.push_async_callback(self.ticker.done)  # last: the tick in flight ends
        stack.callback(self.early.stop)
        stack.enter_context(bus.subscribe(SourcesMoved, self._moved_sources))
        stack.enter_context(bus.subscribe((SourcesWatched, *LINK_CHANGES), self._hear))
        stack.enter_context(bus.subscribe(OwnershipChanged, self._owned))
        stack.enter_context(
            bus.subscribe(ConfigReloaded, lambda c: self.reschedule(c.new.monitor.interval_s))
        )
        stack.enter_context(bus.subscribe(DoingChanged, self._doing))
        start_task(stack, self.on_schedule())

    def _hear(self, change: Change) -> None:
        if links_may_differ(change):
            self.idle = self.idle.heard(change)

    def _doing(self, change: DoingChanged) -> None:
        """A wait for a person that a check of this process ended: observed here, once (the
        check's transaction settled it here only)."""
        if change.waited is not None:
            self.metrics.waited.observe(change.waited / 1000)

    def _moved_sources(self, change: SourcesMoved) -> None:
        self._hear(change)
        self.early.moved(change)

    def _owned(self, change: OwnershipChanged) -> None:
        """The links without a host became ours (their holder died, say): a full tick at
        once, not at the next interval."""
        if change.shared:
            self._now_due = True
            self._interrupt()

    def live_fields(self, new: Config) -> tuple[str, ...]:
        """The interval applies live, from the next tick."""
        return ("monitor.interval_s",)

    def reschedule(self, interval_s: float) -> None:
        """A new interval (a reload): it applies from the next tick."""
        if interval_s != self.schedule.interval_s:
            log.info("the tick's interval is now %g s, from the next tick", interval_s)
        self.schedule = replace(self.schedule, interval_s=interval_s)
        self._interrupt()

    def _interrupt(self) -> None:
        self._rescheduled = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def on_schedule(self) -> None:
        """The fixed tick (see the module docstring)."""
        now = self.timers.monotonic
        due = self.schedule.first(now())
        last: float | None = None  # when the last tick started
        while True:  # until the stack cancels it
            if await self._interrupted(due - now()):
                if self._now_due:  # now, then on the grid from there
                    self._now_due = False
                    due = now()
                else:
                    due = self.schedule.moved(last, due)
                continue
            last = now()
            ran = False
            try:
                ran = await asyncio.shield(asyncio.ensure_future(self.scheduled_tick()))
            except Exception:  # a bug in one tick must not end the ticks: said, and on
                log.exception("a tick failed unexpectedly; the next one runs as planned")
            due, skipped = self.schedule.after(due, now())
            if skipped:
                self._say_skipped()
            elif ran:  # a tick that ran, took its writes and kept up: a skip is news again
                self._skip_logged = False

    async def _interrupted(self, wait_s: float) -> bool:
        """Wait ``wait_s`` on the timers; True when the schedule changed meanwhile."""
        if not self._rescheduled:
            self._wake = wake = asyncio.get_running_loop().create_future()
            timer = self.timers.call_later(max(0.0, wait_s), functools.partial(_end, wake))
            try:
                await wake
            finally:
                timer.cancel()
                self._wake = None
        rescheduled, self._rescheduled = self._rescheduled, False
        return rescheduled

    def _say_skipped(self) -> None:
        if not self._skip_logged:
            log.warning("the previous tick is still running; skipping ticks until it ends")
            self._skip_logged = True

    async def scheduled_tick(self) -> bool:
        """The fixed tick; whether it ran and the store took its writes. One still running
        (waiting for a locked database, an early check) is not queued behind: this one is
        skipped, said once until a tick runs and keeps up (:meth:`on_schedule`). One with
        nothing to read is left out (:class:`IdleRule`)."""
        if self.ticker.busy:
            self._say_skipped()
            return False
        if self.idle.skip():
            self.idle = self.idle.left_out()
            self.bus.publish(TickRan(self.timers.now_ms(), idle=True))
            return True
        self.idle = self.idle.began()
        return await self.run_tick()

    async def run_tick(self, only: set[str] | None = None, *, rearm: bool = True) -> bool:
        """One tick (of the ``only`` keys, an early check); whether the store took all it
        had to write."""
        start = self.timers.monotonic()
        whole = only is None  # a whole tick: the links as they stand now
        try:
            results = await self.ticker.tick(only)
        except SessionwatchError as exc:
            log.warning("tick failed: %s", exc)
            self.bus.publish(TickRan(self.timers.now_ms(), failed=str(exc)))
            if whole:
                self.idle = self.idle.ended(None)  # it read nothing: the next one is full
            return False
        duration = self.timers.monotonic() - start
        at = self.timers.now_ms()
        self.bus.publish(report(self.metrics, results, at_ms=at, duration_s=duration, whole=whole))
        if whole:
            self.idle = self.idle.ended(results)
        if rearm and any(r.outcome == "missing" for r in results):
            self.bus.publish(WatchedMayDiffer())
        more = frozenset(r.session_key for r in results if r.more and not r.unsettled)
        if more:  # stopped at the scan cap: the rest now, in turn with the other keys due
            self._moved_sources(SourcesMoved(more, catch_up=True))
        return not any(r.unsettled for r in results)
