"""The change bus: one module declares every change, a subscription ends when asked, a
listener is told (never polls) and keeps what it has not read, and a costly source of
changes starts with its first listener."""

from __future__ import annotations

import ast
import asyncio

import pytest

from monitor.kernel import bus as bus_module
from monitor.kernel.bus import (
    Bus,
    Change,
    NoticesAcknowledged,
    SourcesMoved,
    StoreMoved,
    TickRan,
    WakeOutcome,
    WatchesChanged,
)
from tests.helpers import REPO


def test_every_change_is_declared_in_the_bus_module_under_one_base() -> None:
    kinds = [k for k in Change.__subclasses__() if not k.__module__.startswith("tests.")]
    assert len(kinds) >= 12
    assert all(k.__module__ == bus_module.__name__ for k in kinds)
    for path in sorted((REPO / "monitor").rglob("*.py")):  # and nowhere else
        if path.name == "bus.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                assert "Change" not in bases, f"{path}: {node.name}"


def test_changes_compare_by_kind_and_fields() -> None:
    assert SourcesMoved(frozenset({"a"})) == SourcesMoved(frozenset({"a"}))
    assert SourcesMoved(frozenset({"a"})) != SourcesMoved(frozenset({"a"}), catch_up=True)
    assert WatchesChanged() != NoticesAcknowledged()  # no fields, other kinds
    assert "WakeOutcome(at_ms=1, error='', result='accepted', url='u', watcher='w')" == repr(
        WakeOutcome("w", "accepted", at_ms=1, url="u")
    )
    assert len({StoreMoved(1), StoreMoved(1), StoreMoved(2)}) == 2


def test_a_subscription_to_several_kinds_ends_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    bus, heard = Bus(), []

    def broken(_: Change) -> None:
        raise RuntimeError("a bug")

    bus.subscribe(WatchesChanged, broken)  # said, and the others still hear
    with bus.subscribe((WatchesChanged, StoreMoved), heard.append):
        assert bus.wants(StoreMoved)
        bus.publish(WatchesChanged())
        bus.publish(StoreMoved(1))
        bus.publish(TickRan())  # not subscribed
    bus.publish(StoreMoved(2))  # after the end
    assert [WatchesChanged(), StoreMoved(1)] == heard
    assert not bus.wants(StoreMoved)
    assert "a subscriber to WatchesChanged failed" in caplog.text


async def test_a_listener_is_told_and_keeps_what_it_has_not_read() -> None:
    bus = Bus()
    async with bus.listen((StoreMoved,), keep=3) as heard:
        assert await heard.next(0) is None  # nothing yet: no wait
        for n in range(5):
            bus.publish(StoreMoved(n))
        assert [StoreMoved(2), StoreMoved(3), StoreMoved(4)] == heard.pending()  # the newest
        waiting = asyncio.ensure_future(heard.next(3600))
        await asyncio.sleep(0)
        bus.publish(StoreMoved(5))
        assert StoreMoved(5) == await asyncio.wait_for(waiting, 30)
        stopping = asyncio.Event()
        waiting = asyncio.ensure_future(heard.next(3600, unless=stopping))
        await asyncio.sleep(0)
        stopping.set()
        assert await asyncio.wait_for(waiting, 30) is None
        bus.publish(StoreMoved(6))
        async for change in heard:
            assert StoreMoved(6) == change
            break
    assert not bus.wants(StoreMoved)  # it ended with the block


def test_a_source_starts_with_its_first_listener_until_its_registration_ends() -> None:
    bus, started = Bus(), []
    with bus.on_first(StoreMoved, lambda: started.append(1)):
        assert [] == started
        bus.subscribe(TickRan, lambda _: None)
        assert [] == started
        bus.listen((StoreMoved,))
        assert [1] == started
    bus.listen((StoreMoved,))
    assert [1] == started  # ended with its block


def test_a_subscriber_to_change_hears_every_kind_once() -> None:
    bus = Bus()
    every: list[Change] = []
    acknowledged: list[Change] = []
    with (
        bus.subscribe(Change, every.append),
        bus.subscribe(NoticesAcknowledged, acknowledged.append),
    ):
        assert bus.wants(TickRan)  # someone hears every kind
        bus.publish(NoticesAcknowledged(()))
        bus.publish(WatchesChanged())
    bus.publish(TickRan())
    assert [NoticesAcknowledged(()), WatchesChanged()] == every
    assert [NoticesAcknowledged(())] == acknowledged
    assert not bus.wants(TickRan)
