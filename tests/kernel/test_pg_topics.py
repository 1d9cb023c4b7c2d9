"""What another process hears of a commit on PostgreSQL: its topics, and only from a commit
that touched something another process acts on (monitor/kernel/topics.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

from monitor.clock import now_ms
from monitor.errors import BadInput
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import StoreMoved
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.store import open_store
from monitor.kernel.store.postgres import CHANNEL, NOTICE_BYTES, PgStore
from monitor.kernel.store.protocol import Conn
from monitor.kernel.topics import EVENTS, LINKS, NOTICES, wake
from monitor.upstream.host_leases import HostLeases
from tests.helpers import PgServer, pg_database


@contextlib.asynccontextmanager
async def two(pg_server: PgServer) -> AsyncIterator[tuple[Any, Any, str]]:
    url = pg_database(pg_server)
    a, b = await open_store(url, clock=now_ms), await open_store(url, clock=now_ms)
    try:
        await a.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
        yield a, b, url
    finally:
        await a.close()
        await b.close()


def told(store: PgStore, v: int, topics: frozenset[str], refuse: bool = False) -> Any:
    def fn(c: Conn) -> int:
        store.announce(c, topics)
        c.execute("INSERT INTO t VALUES (?)", (v,))
        if refuse:
            raise BadInput("refused")
        return v

    return fn


async def heard_until(store: PgStore, done: Callable[[set[str] | None], bool]) -> set[str] | None:
    """What ``store`` heard, gathered until ``done`` says enough (or 5 s)."""
    got: set[str] | None = set()
    for _ in range(100):
        topics = store.heard()
        got = None if topics is None or got is None else got | topics
        if done(got):
            break
        await store.changed(0.05)
    return got


async def test_a_commit_tells_its_topics_and_one_that_touched_nothing_tells_no_one(
    pg_server: PgServer,
) -> None:
    async with two(pg_server) as (a, b, _):
        b.heard()
        before = b.version()
        await a.write(told(a, 1, frozenset()))  # a lease renewed, a step of the ledger
        await a.write(lambda c: c.execute("INSERT INTO t VALUES (2)"))  # announced nothing
        assert not await b.changed(0.5)
        assert before == b.version()
        await a.write(told(a, 3, frozenset({EVENTS, wake("agent:main:main")})))
        got = await heard_until(b, lambda got: bool(got))
        assert {EVENTS, wake("agent:main:main")} == got


async def test_a_write_rolled_back_tells_nothing_and_a_group_tells_the_rest(
    pg_server: PgServer,
) -> None:
    async with two(pg_server) as (a, b, _):
        b.heard()
        writes = [
            a.write(told(a, 1, frozenset({EVENTS}))),
            a.write(told(a, 2, frozenset({LINKS}), refuse=True)),
            a.write(told(a, 3, frozenset({NOTICES}))),
        ]
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert isinstance(results[1], BadInput)
        got = await heard_until(b, lambda got: got is None or {EVENTS, NOTICES} <= got)
        await asyncio.sleep(0.3)  # anything later would be heard by now
        assert got is not None
        assert {EVENTS, NOTICES} == got | (b.heard() or set())


async def test_too_much_to_carry_and_a_notice_without_topics_are_heard_as_anything(
    pg_server: PgServer,
) -> None:
    async with two(pg_server) as (a, b, url):
        b.heard()
        many = frozenset(wake(f"agent:w{i}:main") for i in range(NOTICE_BYTES // 10))
        await a.write(told(a, 1, many))
        assert await heard_until(b, lambda got: got is None) is None
        # an earlier release's notice: its token alone, with every write
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, "0123456789abcdef"))
        assert await heard_until(b, lambda got: got is None) is None
        assert set() == b.heard()  # heard() took it


async def test_a_peer_hears_a_turn_by_its_topics_and_not_a_lease_renewal(
    pg_server: PgServer,
) -> None:
    """Two kernels on one database, as two hosts: a turn recorded on one is heard on the
    other as the watcher to wake and what moved; the other's lease upkeep moves nothing."""
    url = pg_database(pg_server)
    a, b = await Kernel.open(url), await Kernel.open(url)
    try:
        await a.watch(watcher="agent:main:main", target="agent:main:dashboard:x")
        await a.watch(watcher="agent:main:subagent:s", target="agent:main:dashboard:x")
        async with b.bus.listen((StoreMoved,)) as heard:
            await a.record(
                NewEvent(
                    session_key="agent:main:dashboard:x",
                    kind=EventKind.HUMAN_DIRECT_MESSAGE,
                    actor_type=ActorType.HUMAN,
                )
            )
            wanted = {EVENTS, NOTICES, wake("agent:main:main")}
            topics: set[str] = set()
            while not wanted <= topics:  # the watch's own may come first
                moved = await heard.next(5)
                assert isinstance(moved, StoreMoved)
                assert moved.topics is not None
                topics |= moved.topics
            assert wake("agent:main:subagent:s") not in topics  # queue-only: never woken
            leases = HostLeases(a, "host-a", ttl_ms=3000)
            stack = contextlib.AsyncExitStack()
            await leases.start(stack, a.bus)
            await leases.renew()
            await stack.aclose()
            assert await heard.next(0.5) is None
    finally:
        await a.close()
        await b.close()


async def test_a_watch_is_heard_as_links(pg_server: PgServer) -> None:
    url = pg_database(pg_server)
    a, b = await Kernel.open(url), await Kernel.open(url)
    try:
        async with b.bus.listen((StoreMoved,)) as heard:
            await a.watch(watcher="agent:main:main", target="agent:main:dashboard:x")
            moved = await heard.next(5)
            assert isinstance(moved, StoreMoved)
            assert moved.about(LINKS)
    finally:
        await a.close()
        await b.close()
