"""A share of the watchers each (monitor/delivery/shares.py): every watcher has exactly one
owner among hosts that agree on who is live, a host joining or leaving moves only its own
share, and on one PostgreSQL database only the owner of a watcher writes for its wakes,
until it dies and another takes its share."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from monitor.clock import now_ms
from monitor.delivery.hooks import WakeAnswer
from monitor.delivery.ledger import Delivery
from monitor.delivery.shares import Shares
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import HostsChanged
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.store import open_store
from tests.helpers import PgServer, pg_database, until

HOSTS = st.frozensets(st.text("abcdefgh-", min_size=1, max_size=6), min_size=1, max_size=8)
WATCHERS = st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=40, unique=True)


def owners(hosts: frozenset[str], watchers: list[str]) -> dict[str, str]:
    shares = {h: Shares(h) for h in hosts}
    for s in shares.values():
        s.update(hosts)
    found: dict[str, str] = {}
    for w in watchers:
        owning = [h for h, s in shares.items() if s.owns(w)]
        assert len(owning) == 1, (w, owning)
        found[w] = owning[0]
    return found


@given(hosts=HOSTS, watchers=WATCHERS, new=st.text("xyz", min_size=1, max_size=3))
def test_each_watcher_has_one_owner_and_a_host_moves_only_its_own_share(
    hosts: frozenset[str], watchers: list[str], new: str
) -> None:
    before = owners(hosts, watchers)
    joined = owners(hosts | {new}, watchers)
    assert all(joined[w] in (before[w], new) for w in watchers)  # to the newcomer only
    gone = min(hosts)
    if len(hosts) > 1:
        left = owners(hosts - {gone}, watchers)
        assert all(left[w] == before[w] for w in watchers if before[w] != gone)


def test_alone_or_before_the_hosts_are_read_a_host_owns_every_watcher() -> None:
    assert Shares().owns("agent:main:main")
    early = Shares("a")
    assert not early.known and early.owns("agent:main:main")
    assert early.update(frozenset({"b"}))  # its own lease lapsed a moment: still counted
    assert frozenset({"a", "b"}) == early.hosts
    assert not early.update(frozenset({"a", "b"}))  # the same set: nothing moved


@dataclass
class Taker:
    """A gateway stand-in that takes every wake, and says which host sent it."""

    host: str
    woken: list[tuple[str, str]]
    retry_s: float = 30.0

    def quiet_s(self) -> float:
        return 0.0

    async def wake(
        self, watcher: str, text: str, *, still: Callable[[], Awaitable[bool]] | None = None
    ) -> WakeAnswer | None:
        if still is not None and not await still():
            return None
        self.woken.append((self.host, watcher))
        return WakeAnswer("accepted")


@dataclass
class Host:
    name: str
    kernel: Kernel
    delivery: Delivery
    stack: contextlib.AsyncExitStack
    writes: Counter[str] = field(default_factory=Counter)


@contextlib.asynccontextmanager
async def hosts_on(url: str, names: list[str]) -> AsyncIterator[tuple[list[Host], list[Any]]]:
    woken: list[tuple[str, str]] = []
    hosts: list[Host] = []
    try:
        for name in names:
            kernel = await Kernel.on_store(await open_store(url, clock=now_ms))
            delivery = Delivery(kernel, Taker(name, woken), host=name, holder=name, window_ms=50)
            host = Host(name, kernel, delivery, contextlib.AsyncExitStack())
            _count_ledger_writes(kernel, host.writes)
            await delivery.start(host.stack, kernel.bus)
            hosts.append(host)
        for host in hosts:
            host.kernel.bus.publish(HostsChanged(frozenset(names)))
        yield hosts, woken
    finally:
        for host in hosts:
            await host.stack.aclose()
            await host.kernel.close()


def _count_ledger_writes(kernel: Kernel, writes: Counter[str]) -> None:
    """Count the wake ledger's writes through ``kernel``'s commits (each of a pass's steps,
    and the outcome's record) in ``writes["ledger"]``."""
    commits = kernel.commits
    write, commit = commits.write, commits.commit

    def counted(fn: Any) -> None:
        name = getattr(fn, "__qualname__", "")
        writes["ledger"] += name.startswith(("Delivery.", "_settling."))

    async def counting_write(fn: Any, **kw: Any) -> Any:
        counted(fn)
        return await write(fn, **kw)

    async def counting_commit(fn: Any, **kw: Any) -> Any:
        counted(fn)
        return await commit(fn, **kw)

    commits.write = counting_write  # type: ignore[method-assign]
    commits.commit = counting_commit  # type: ignore[method-assign]


async def turn(kernel: Kernel, target: str) -> None:
    await kernel.record(
        NewEvent(
            session_key=target, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
        )
    )


async def test_only_a_watcher_s_owner_writes_for_its_wakes_until_it_dies(
    pg_server: PgServer,
) -> None:
    url = pg_database(pg_server)
    watchers = [f"agent:w{i}:main" for i in range(12)]
    async with hosts_on(url, ["a", "b", "c"]) as (hosts, woken):
        a = hosts[0]
        for i, w in enumerate(watchers):
            await a.kernel.watch(watcher=w, target=f"agent:main:subagent:t{i}")
        owner = {
            w: next(h.name for h in hosts if h.delivery.lookout.shares.owns(w)) for w in watchers
        }
        assert {"a", "b", "c"} == set(owner.values())  # twelve watchers: each host has some
        for h in hosts:
            h.writes.clear()
        for i in range(len(watchers)):
            await turn(a.kernel, f"agent:main:subagent:t{i}")  # every turn through host a
        await until("every watcher woken", lambda: len(woken) == len(watchers))
        assert sorted(woken) == sorted((owner[w], w) for w in watchers)  # by the owner, once
        for h in hosts:  # claim, hold, settle, release: four writes per wake, by its owner
            assert h.writes["ledger"] == 4 * sum(o == h.name for o in owner.values()), h.name
        # c dies: its lease runs out, and the others' next renewal reads the hosts without it
        c = hosts.pop()
        await c.stack.aclose()
        await c.kernel.close()
        for h in hosts:
            h.kernel.bus.publish(HostsChanged(frozenset({"a", "b"})))
        woken.clear()
        theirs = [i for i, w in enumerate(watchers) if owner[w] == "c"]
        for i in theirs:
            await turn(a.kernel, f"agent:main:subagent:t{i}")
        await until("c's watchers woken", lambda: len(woken) == len(theirs))
        assert {h for h, _ in woken} <= {"a", "b"}
        assert sorted(w for _, w in woken) == sorted(watchers[i] for i in theirs)
        await asyncio.sleep(0.3)
        assert len(woken) == len(theirs)  # once each


async def test_a_host_that_takes_a_share_wakes_what_its_last_owner_left_pending(
    pg_server: PgServer,
) -> None:
    """Notices opened while their owner was gone (dead, its lease not yet run out) are
    found by the host that takes its share, when its hosts change: not left to a turn."""
    url = pg_database(pg_server)
    async with hosts_on(url, ["a", "b"]) as (hosts, woken):
        a, b = hosts
        watchers = [f"agent:w{i}:main" for i in range(8)]
        for i, w in enumerate(watchers):
            await a.kernel.watch(watcher=w, target=f"agent:main:subagent:t{i}")
        bs = [i for i, w in enumerate(watchers) if b.delivery.lookout.shares.owns(w)]
        assert bs
        await b.stack.aclose()  # b stops delivering, and no one else owns its watchers
        for i in bs:
            await turn(a.kernel, f"agent:main:subagent:t{i}")
        await asyncio.sleep(0.5)
        assert woken == []
        a.kernel.bus.publish(HostsChanged(frozenset({"a"})))  # b's lease ran out
        await until("b's watchers woken", lambda: len(woken) == len(bs))
        assert sorted(woken) == sorted(("a", watchers[i]) for i in bs)
