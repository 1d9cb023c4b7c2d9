"""The store protocol (``monitor.kernel.store.protocol.StateStore``), held against each store
that implements it: SQLite's service store, SQLite's direct store (one-shot commands) and
PostgreSQL. Each test states one sentence of the protocol's documentation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from monitor.clock import now_ms
from monitor.errors import BadInput, StoreError
from monitor.kernel.store import open_store
from tests.helpers import PgServer, pg_database

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn, StateStore


@pytest.fixture(params=["sqlite", "sqlite-direct", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path | str, bool]:
    """Where the store lives, and whether it is the direct one."""
    if request.param == "postgresql":
        server: PgServer = request.getfixturevalue("pg_server")
        return pg_database(server), False
    return tmp_path / "state.db", request.param == "sqlite-direct"


@pytest.fixture
async def store(target: tuple[Path | str, bool]) -> AsyncIterator[StateStore]:
    opened = await open_store(target[0], clock=now_ms, direct=target[1])
    await opened.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
    yield opened
    await opened.close()


TOLD = frozenset({"events", "wake:agent:main:main"})


def insert(v: int, *, refuse: bool = False) -> Callable[[Conn], int]:
    def fn(c: Conn) -> int:
        c.execute("INSERT INTO t VALUES (?)", (v,))
        if refuse:
            raise BadInput(f"{v} is refused")
        return v

    return fn


def told(store: StateStore, v: int, topics: frozenset[str] = TOLD) -> Callable[[Conn], int]:
    """``insert(v)``, announcing ``topics`` to the other processes."""

    def fn(c: Conn) -> int:
        store.announce(c, topics)
        return insert(v)(c)

    return fn


def values(c: Conn) -> list[int]:
    return [int(v) for (v,) in c.execute("SELECT v FROM t ORDER BY v").fetchall()]


async def test_a_write_returns_its_value_and_commits_before_it_returns(store: StateStore) -> None:
    assert 1 == await store.write(insert(1))
    assert [1] == await store.read(values)
    assert [1] == await store.peek(values)


async def test_a_writes_own_error_is_raised_as_it_is_and_rolls_back_only_its_writes(
    store: StateStore,
) -> None:
    answers = await asyncio.gather(
        store.write(insert(1)),
        store.write(insert(2, refuse=True)),
        store.write(insert(3)),
        return_exceptions=True,
    )
    assert 1 == answers[0] and 3 == answers[2]
    assert isinstance(answers[1], BadInput) and "2 is refused" == str(answers[1])
    assert [1, 3] == await store.read(values)


async def test_a_write_may_run_twice_and_running_it_again_is_running_it_once(
    store: StateStore,
) -> None:
    """A write whose group failed elsewhere runs again; what it sees the second time is what
    it saw the first, so it takes effect once."""
    seen: list[list[int]] = []

    def counted(c: Conn) -> int:
        seen.append(values(c))
        c.execute("INSERT INTO t VALUES (?)", (len(seen[-1]) + 10,))
        return len(seen[-1])

    answers = await asyncio.gather(
        *(store.write(counted) for _ in range(3)),
        store.write(insert(99, refuse=True)),
        return_exceptions=True,
    )
    assert isinstance(answers[3], BadInput)
    found = await store.read(values)
    assert 3 == len(found), found  # each took effect once, however often it ran
    assert sorted(answers[:3]) == [0, 1, 2]  # type: ignore[type-var]
    for run in seen:
        assert run == sorted(run)
    assert len(seen) >= 3


async def test_reads_see_one_snapshot_and_never_write(store: StateStore) -> None:
    await store.write(insert(1))

    def both(c: Conn) -> tuple[list[int], list[int]]:
        return values(c), values(c)

    first, second = await store.read(both)
    assert first == second == [1]
    with pytest.raises(StoreError):
        await store.read(insert(2))  # read-only
    assert [1] == await store.read(values)


async def test_the_version_never_moves_with_the_stores_own_commits(store: StateStore) -> None:
    """This process's commits are published as they happen; the version is for others'."""
    before = store.version()
    for n in range(3):
        await store.write(told(store, n))
        await store.write(told(store, 10 + n), small=True)
    await store.changed(0.5)  # PostgreSQL: its own notices would have arrived by now
    assert before == store.version()


async def test_the_version_moves_with_a_commit_of_another_connection(
    store: StateStore, target: tuple[Path | str, bool]
) -> None:
    """... that announced what it touched: what the store heard says so, or that anything
    may have moved (None: SQLite can say no more)."""
    before = store.version()
    store.heard()  # from here
    other = await open_store(target[0], clock=now_ms, direct=True)
    try:
        await other.write(told(other, 1))
    finally:
        await other.close()
    for _ in range(100):  # PostgreSQL's notice arrives on the listening connection
        if store.version() != before:
            break
        await store.changed(0.05)
    assert store.version() != before
    heard = store.heard()
    assert heard is None or heard == TOLD


async def test_after_close_every_call_fails_with_a_store_error(store: StateStore) -> None:
    await store.close()
    with pytest.raises(StoreError):
        await store.write(insert(1))
    await store.close()  # a second close is harmless


def test_the_protocol_documents_every_method_and_that_a_write_may_run_twice() -> None:
    from monitor.kernel.store.protocol import StateStore

    documented = [
        name
        for name, member in vars(StateStore).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    ]
    assert {"write", "read", "peek", "version", "changed", "close", "path"} <= set(documented)
    for name in documented:
        assert getattr(StateStore, name).__doc__, f"StateStore.{name} has no docstring"
    assert "may run twice" in " ".join((StateStore.__doc__ or "").split())


async def test_each_store_has_every_member_of_the_protocol(store: StateStore) -> None:
    from monitor.kernel.store.protocol import StateStore

    members = [n for n in vars(StateStore) if not n.startswith("_")]
    members += list(StateStore.__annotations__)
    assert [] == [m for m in members if not hasattr(store, m)]
