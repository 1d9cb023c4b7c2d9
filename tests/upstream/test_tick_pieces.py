"""The tick's pieces on their own (``serve/ticks.py``): the idle rule and the schedule as
values, the early checks and the schedule's loop on manual timers, so no test here waits in
real time. The ticker is a scripted stand-in: the tick's own reading is tested with a real
one (test_idle_ticks, test_upstream); what is tested here is when ticks run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.kernel.bus import (
    Bus,
    LinksChanged,
    OwnershipChanged,
    SourcesMoved,
    SourcesWatched,
    TickRan,
)
from monitor.metrics import Metrics
from monitor.serve.ticks import FULL_EVERY, SETTLE_MS, EarlyChecks, IdleRule, Schedule, Ticks
from monitor.testing import ManualClock, ManualTimers, settle_loop
from monitor.upstream.settle import LinkResult

QUIET = [LinkResult(session_key="a", outcome="quiet"), LinkResult(session_key="b", outcome="quiet")]


def quiet_and_heard() -> IdleRule:
    """A rule after a full tick that found links a and b quiet, both heard by a watch."""
    return IdleRule().heard(SourcesWatched("files", frozenset("ab"))).began().ended(QUIET)


def test_a_tick_is_left_out_only_when_nothing_moved_and_every_quiet_link_is_heard() -> None:
    assert not IdleRule().skip()  # nothing read yet
    assert quiet_and_heard().skip()
    assert not quiet_and_heard().heard(LinksChanged()).skip()  # a link changed
    assert not quiet_and_heard().heard(SourcesWatched("files", frozenset("a"))).skip()
    assert quiet_and_heard().heard(SourcesWatched("nodes", frozenset())).skip()  # per watcher
    active = [
        LinkResult(session_key="a", outcome="quiet"),
        LinkResult(session_key="b", outcome="activity", turns=1),
    ]
    assert not quiet_and_heard().began().ended(active).skip()
    assert not quiet_and_heard().began().ended(None).skip()  # a failed tick read nothing


def test_one_scheduled_tick_in_full_every_is_full_whatever_was_heard() -> None:
    rule = quiet_and_heard()
    left = 0
    while rule.skip():
        rule, left = rule.left_out(), left + 1
    assert FULL_EVERY - 1 == left
    assert rule.began().ended(QUIET).skip()  # the full one starts the count again


@given(st.lists(st.sampled_from(["watched", "moved", "left", "began", "ended"]), max_size=30))
def test_whatever_moved_since_a_full_tick_began_keeps_the_next_one_full(steps: list[str]) -> None:
    """The rule is a value: each step gives a new one, the old one is as it was."""
    rule = quiet_and_heard()
    moved_since_began = False
    for step in steps:
        before = rule
        if step == "watched":
            rule = rule.heard(SourcesWatched("files", frozenset("ab")))
        elif step == "moved":
            rule, moved_since_began = rule.heard(SourcesMoved(frozenset("a"))), True
        elif step == "left":
            rule = rule.left_out()
        elif step == "began":
            rule, moved_since_began = rule.began(), False
        else:
            rule = rule.ended(QUIET)
        assert before is not rule
        if moved_since_began:
            assert not rule.skip()


def test_the_schedule_is_a_grid_that_skips_what_a_slow_tick_ran_past() -> None:
    schedule = Schedule(interval_s=10, initial_delay_s=3)
    assert 103 == schedule.first(100)
    assert (113, False) == schedule.after(103, 105)  # kept up
    assert (113, False) == schedule.after(103, 113)  # ended just as the next is due
    assert (133, True) == schedule.after(103, 125)  # ran past 113 and 123: one skip
    assert 35 == Schedule(30, 3).moved(5, 13)  # a new interval: from the last tick
    assert 13 == Schedule(30, 3).moved(None, 13)  # none ran yet: the first stays


class Checks:
    """What the early checks asked for, each check held until the test lets it end."""

    def __init__(self) -> None:
        self.asked: list[tuple[set[str], bool]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, keys: set[str], rearm: bool) -> None:
        self.asked.append((keys, rearm))
        await self.gate.wait()


async def test_keys_moved_during_a_check_are_checked_in_one_go_after_it() -> None:
    checks = Checks()
    early = EarlyChecks(ManualTimers(ManualClock()), checks)
    checks.gate.clear()
    early.moved(SourcesMoved(frozenset("a")))
    await settle_loop()
    early.moved(SourcesMoved(frozenset("b"), catch_up=True))
    early.moved(SourcesMoved(frozenset("c"), catch_up=True))
    checks.gate.set()
    await settle_loop()
    assert [({"a"}, True), ({"b", "c"}, False)] == checks.asked  # a catch-up re-arms nothing


async def test_a_databases_keys_are_checked_again_after_its_last_write() -> None:
    timers = ManualTimers(ManualClock())
    checks = Checks()
    early = EarlyChecks(timers, checks)
    early.moved(SourcesMoved(frozenset({"db"}), settling=True))
    await timers.advance(SETTLE_MS[0] - 1)
    early.moved(SourcesMoved(frozenset({"db"}), settling=True))  # a second write: again
    await timers.advance(SETTLE_MS[-1])
    assert 2 + len(SETTLE_MS) == len(checks.asked)
    assert [] == timers.delays_ms  # the series ended with its last
    early.moved(SourcesMoved(frozenset({"db"}), settling=True))
    early.stop()
    assert [] == timers.delays_ms  # stopping cancels the settling
    await timers.advance(SETTLE_MS[-1])
    assert 2 + len(SETTLE_MS) == len(checks.asked)  # no check starts once stopped


class Ticker:
    """A stand-in for :class:`monitor.upstream.tick.Ticker`: each tick finds what the test
    scripted, in turn (quiet links once the script ran out), and says which keys it was
    asked for."""

    def __init__(self) -> None:
        self.busy = False
        self.asked: list[set[str] | None] = []
        self.script: list[list[LinkResult]] = []

    async def tick(self, only: set[str] | None = None) -> list[LinkResult]:
        self.asked.append(only)
        return self.script.pop(0) if self.script else QUIET

    async def done(self) -> None:
        pass


@asynccontextmanager
async def ticks(
    interval_s: float, initial_delay_s: float
) -> AsyncIterator[tuple[Ticks, Ticker, ManualTimers, list[TickRan]]]:
    """Ticks started on manual timers, with the ticks it said."""
    ticker, timers, bus = Ticker(), ManualTimers(ManualClock()), Bus()
    ran: list[TickRan] = []
    bus.subscribe(TickRan, ran.append)
    tick = Ticks(ticker, Metrics(), timers, interval_s=interval_s, initial_delay_s=initial_delay_s)  # type: ignore[arg-type]
    async with AsyncExitStack() as stack:
        await tick.start(stack, bus)
        await settle_loop()
        yield tick, ticker, timers, ran


async def test_ticks_run_on_the_grid_and_a_reload_measures_the_wait_again_from_the_last() -> None:
    async with ticks(10, 3) as (tick, ticker, timers, ran):
        await timers.advance(2_999)
        assert [] == ticker.asked
        await timers.advance(1)
        await timers.advance(10_000)
        assert [None, None] == ticker.asked  # at 3 s and 13 s
        tick.reschedule(30)
        await timers.advance(29_999)  # 13 + 30 = 43 s
        assert 2 == len(ticker.asked)
        await timers.advance(1)
        assert 3 == len(ticker.asked)
        assert all(r.duration_s == 0 and not r.idle for r in ran)


async def test_quiet_heard_links_leave_ticks_out_but_one_in_full_every() -> None:
    async with ticks(1, 0) as (tick, ticker, timers, ran):
        tick.bus.publish(SourcesWatched("files", frozenset("ab")))
        await timers.advance(FULL_EVERY * 1_000)
        assert 2 == len(ticker.asked)  # at 0 s (full, then quiet) and at FULL_EVERY s
        assert FULL_EVERY - 1 == sum(r.idle for r in ran)
        tick.bus.publish(LinksChanged())
        await timers.advance(1_000)
        assert 3 == len(ticker.asked)  # a link changed: the next tick is full


async def test_gaining_the_links_without_a_host_runs_a_tick_at_once_and_the_grid_goes_on() -> None:
    async with ticks(10, 3) as (tick, ticker, timers, _):
        await timers.advance(5_000)  # the first tick at 3 s
        tick.bus.publish(OwnershipChanged(shared=True, holder="h"))
        await timers.advance(0)
        assert 2 == len(ticker.asked)  # at 5 s
        await timers.advance(9_999)
        assert 2 == len(ticker.asked)
        await timers.advance(1)
        assert 3 == len(ticker.asked)  # at 15 s: the grid from 5 s
        tick.bus.publish(OwnershipChanged(shared=False, holder="h"))  # lost: nothing at once
        await timers.advance(0)
        assert 3 == len(ticker.asked)


async def test_an_early_check_that_stopped_at_the_cap_goes_on_at_once() -> None:
    async with ticks(3600, 3600) as (tick, ticker, _timers, _):
        ticker.script = [[LinkResult(session_key="a", outcome="activity", turns=1, more=True)]]
        tick.bus.publish(SourcesMoved(frozenset("a")))
        await settle_loop()
        assert [{"a"}, {"a"}] == ticker.asked


async def test_the_tick_loop_runs_ticks_one_at_a_time_and_stopping_never_cuts_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fixed tick is a plain loop: each tick is awaited before the next is due, so two
    never run at once; the ticks a slow one ran past are skipped and said once; a tick that
    raises is said and the ticks go on; and cancelling the loop (the service stopping)
    leaves the tick in flight to finish."""
    async with ticks(3600, 3600) as (tick, _, timers, _):  # its own loop is not due
        tick.schedule = Schedule(interval_s=0.01, initial_delay_s=0)
        gates = [asyncio.Event() for _ in range(6)]  # tick n finishes once gates[n] is set
        started: list[int] = []
        finished: list[int] = []
        overlaps: list[int] = []

        async def slow_tick() -> bool:
            if len(started) != len(finished):
                overlaps.append(len(started))
            n = len(started)
            started.append(n)
            await gates[n].wait()
            finished.append(n)
            if n == 1:
                raise RuntimeError("a bug in one tick")  # said, and the ticks go on
            return True

        tick.scheduled_tick = slow_tick  # type: ignore[method-assign]
        caplog.set_level(logging.WARNING)
        loop = asyncio.ensure_future(tick.on_schedule())
        await timers.advance(0)
        assert [0] == started
        await timers.advance(50)  # five intervals pass while the first tick waits
        for gate in gates[:3]:
            gate.set()
            await timers.advance(10)
        assert [0, 1, 2] == finished
        assert 4 == len(started)  # the fourth, in flight
        loop.cancel()  # stopping, with the fourth tick in flight
        await asyncio.gather(loop, return_exceptions=True)
        gates[3].set()
        await timers.advance(100)
        assert [0, 1, 2, 3] == finished
        assert 4 == len(started)  # no tick after the stop
        assert [] == overlaps
        said = [r.getMessage() for r in caplog.records]
        assert 1 == sum("skipping ticks" in m for m in said), said
        assert 1 == sum("a tick failed unexpectedly" in m for m in said), said
