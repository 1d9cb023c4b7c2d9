"""Group commit on SQLite: the writer thread folds the writes that wait into one
transaction; a write that fails rolls back alone; every write runs to effect once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from monitor.clock import now_ms
from monitor.errors import BadInput, StoreError, StoreLocked
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import WatchesChanged
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.store import open_store
from monitor.kernel.store.batch import PendingWrite
from monitor.kernel.store.postgres import PgStore
from monitor.kernel.store.sqlite import Store, run_group
from monitor.kernel.store.sqlite_conn import configure
from monitor.metrics import Metrics
from tests.helpers import PgServer, pg_database, until

if TYPE_CHECKING:
    from monitor.kernel.drafts import Recorded
    from monitor.kernel.recorder import Recorder
    from monitor.kernel.store.protocol import Conn


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "g.db", check_same_thread=False)
    configure(conn)
    conn.execute("CREATE TABLE t (v INTEGER)")
    yield conn
    conn.close()


def insert(v: int, *, refuse: bool = False) -> Callable[[sqlite3.Connection], int]:
    def fn(c: sqlite3.Connection) -> int:
        c.execute("INSERT INTO t VALUES (?)", (v,))
        if refuse:
            raise BadInput(f"{v} is refused")
        return v

    return fn


def on_thread(fn: Callable[[sqlite3.Connection], Any]) -> Callable[[sqlite3.Connection], int]:
    """``fn``, answering which thread ran it."""

    def run(c: sqlite3.Connection) -> int:
        fn(c)
        return threading.get_ident()

    return run


def writes(*fns: Callable[[sqlite3.Connection], Any]) -> list[PendingWrite]:
    loop = asyncio.new_event_loop()
    try:
        deadline = time.monotonic() + 5
        return [PendingWrite(fn, deadline, 5.0, loop.create_future()) for fn in fns]
    finally:
        loop.close()


def rows(conn: sqlite3.Connection) -> list[int]:
    return [v for (v,) in conn.execute("SELECT v FROM t ORDER BY v")]


def test_a_group_commits_every_write_once(conn: sqlite3.Connection) -> None:
    results = run_group(conn, writes(*(insert(v) for v in range(5))))
    assert [(True, v) for v in range(5)] == results
    assert [0, 1, 2, 3, 4] == rows(conn)
    assert not conn.in_transaction


def test_a_failing_write_rolls_back_alone_and_the_others_run_once(
    conn: sqlite3.Connection,
) -> None:
    """The first pass has no savepoints; the failure sends the group through again, one
    savepoint each, and nothing of the first pass stays."""
    group = writes(*(insert(v, refuse=v == 3) for v in range(6)))
    results = run_group(conn, group)
    assert [True, True, True, False, True, True] == [ok for ok, _ in results]
    assert "3 is refused" == str(results[3][1])
    assert [0, 1, 2, 4, 5] == rows(conn)


def test_a_write_that_breaks_the_transaction_fails_the_writes_before_it(
    conn: sqlite3.Connection,
) -> None:
    """When SQLite itself rolls the transaction back, no write of it committed, and each
    says so."""

    def break_it(c: sqlite3.Connection) -> None:
        c.execute("ROLLBACK")
        raise StoreError("the transaction is gone")

    results = run_group(conn, writes(insert(1), break_it, insert(2)))
    assert [False, False] == [ok for ok, _ in results[:2]]
    assert [] == [v for v in rows(conn) if v == 1]
    assert not conn.in_transaction


async def queued(store: Any, n: int) -> None:
    """Until ``n`` writes are handed to the writer thread (no time passes: each is handed
    on its task's first steps)."""
    for _ in range(100):
        if store.queued >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{store.queued} writes queued, not {n}")


async def test_writes_that_wait_for_the_writer_share_one_transaction(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    try:
        await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
        statements: list[str] = []
        busy, release = threading.Event(), threading.Event()

        def hold(c: sqlite3.Connection) -> None:
            c.set_trace_callback(statements.append)
            busy.set()
            release.wait(10)

        first = asyncio.ensure_future(store.write(hold))
        await asyncio.to_thread(busy.wait, 10)
        waiting = [asyncio.ensure_future(store.write(insert(v))) for v in range(10)]
        await queued(store, 11)  # every write is queued behind the busy writer
        release.set()
        await first
        assert list(range(10)) == await asyncio.gather(*waiting)
        await store.write(lambda c: c.set_trace_callback(None))
        inserts = [i for i, s in enumerate(statements) if s.startswith("INSERT")]
        assert 10 == len(inserts)
        between = statements[inserts[0] : inserts[-1]]
        assert not [s for s in between if s in {"BEGIN IMMEDIATE", "COMMIT"}]  # one transaction
    finally:
        await store.close()


async def test_a_kernel_commit_run_again_in_its_group_is_observed_once(tmp_path: Path) -> None:
    """A write that fails sends its group through again, one savepoint each: an event the
    kernel recorded in the first pass is recorded, counted and published once, and the
    watches it armed once."""
    metrics = Metrics()
    kernel = await Kernel.open(tmp_path / "state.db", metrics=metrics)
    try:
        busy, release = threading.Event(), threading.Event()

        def hold(c: Conn) -> None:
            busy.set()
            release.wait(10)

        def refuse(c: Conn) -> None:
            raise BadInput("refused")

        def spawned(child: str) -> Callable[[Recorder], Recorded]:
            draft = NewEvent(
                session_key=child,
                kind=EventKind.CHILD_SPAWNED,
                actor_type=ActorType.AGENT,
                actor_id="agent:main:main",
                run_id=f"run-{child}",
            ).draft(now_ms())
            return lambda record: record(draft)

        first = asyncio.ensure_future(kernel.store.write(hold))
        await asyncio.to_thread(busy.wait, 10)
        armed: list[bool] = []
        kernel.bus.subscribe(WatchesChanged, lambda _: armed.append(True))
        before = asyncio.ensure_future(kernel.commit(spawned("agent:main:subagent:a")))
        failing = asyncio.ensure_future(kernel.store.write(refuse))
        after = asyncio.ensure_future(kernel.commit(spawned("agent:main:subagent:b")))
        await queued(kernel.store, 4)  # all three wait behind the busy writer, in one group
        release.set()
        await first
        assert not (await before).duplicate
        with pytest.raises(BadInput):
            await failing
        assert not (await after).duplicate
        assert 'sessionwatch_events_recorded_total{kind="child_spawned"} 2.0' in (
            metrics.render().decode()
        )
        assert [True, True] == armed
    finally:
        await kernel.close()


async def test_close_finishes_the_writes_already_submitted(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
    pending = [asyncio.ensure_future(store.write(insert(v))) for v in range(20)]
    await asyncio.sleep(0)  # submitted
    await store.close()
    assert list(range(20)) == await asyncio.gather(*pending)
    with pytest.raises(StoreError, match="closed"):
        await store.write(insert(99))
    check = sqlite3.connect(tmp_path / "state.db")
    assert 20 == check.execute("SELECT count(*) FROM t").fetchone()[0]
    check.close()


@contextlib.contextmanager
def lock_held(target: Path | str) -> Iterator[None]:
    """Another process's connection holding the store's write lock until the end."""
    if isinstance(target, Path):
        conn = sqlite3.connect(target, isolation_level=None, timeout=0)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    import psycopg

    from monitor.kernel.store.postgres import WRITE_LOCK

    with psycopg.connect(target, autocommit=True) as pg:
        pg.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
        yield


async def test_while_another_process_holds_the_lock_each_write_waits_only_its_own_timeout(
    store_target: Path | str,
) -> None:
    """Writes that arrive one after another while the store is locked each fail after
    their own timeout, not when the last of the writes waiting with them gives up."""
    store = await open_store(store_target, clock=now_ms)
    assert isinstance(store, Store | PgStore)
    store.write_timeout = 1.5
    try:
        with lock_held(store_target):

            async def timed(after: float) -> float:
                await asyncio.sleep(after)
                start = time.monotonic()
                with pytest.raises(StoreLocked):
                    await store.write(lambda c: None)
                return time.monotonic() - start

            waits = await asyncio.gather(*(timed(0.25 * i) for i in range(8)))
        assert [] == [w for w in waits if w > store.write_timeout + 1.0]
        assert [(1,)] == await store.write(lambda c: c.execute("SELECT 1").fetchall())  # at once
    finally:
        await store.close()


async def test_a_postgresql_batch_that_does_not_commit_reports_every_write_failed(
    pg_server: PgServer,
) -> None:
    """A write whose batch lost its connection before the commit was not written, and its
    caller hears so, whatever the writes before it answered."""
    store = await open_store(pg_database(pg_server), clock=now_ms)
    try:
        await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))

        def cut(c: Conn) -> None:
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        answers = await asyncio.gather(
            store.write(lambda c: c.execute("INSERT INTO t VALUES (1)")),
            store.write(cut),
            return_exceptions=True,
        )
        assert [True, True] == [isinstance(a, StoreError) for a in answers]
        assert [(0,)] == await store.read(lambda c: c.execute("SELECT count(*) FROM t").fetchall())
    finally:
        await store.close()


async def test_a_postgresql_store_listens_before_it_is_handed_out(pg_server: PgServer) -> None:
    """The listener's first connection is made while the store opens, and is not a change
    (a reconnection is: notices may have been missed). Counted later, it woke a waiter whose
    mark was taken the moment the store opened (seen in CI as a stop that ended a wait with
    a change)."""
    target = pg_database(pg_server)
    store = await open_store(target, clock=now_ms)
    try:
        assert isinstance(store, PgStore)
        opened = store.version()
        await store.changed(0.5)
        assert opened == store.version()
        await store.write(lambda c: None)  # its own commit: published by the kernel
        await store.changed(0.5)
        assert opened == store.version()
        other = await open_store(target, clock=now_ms)
        try:
            await other.write(lambda c: other.announce(c, frozenset({"events"})))
        finally:
            await other.close()
        await until("another store's write heard", lambda: (store.version() or 0) > opened)
        written = store.version()
        import psycopg

        with psycopg.connect(target, autocommit=True) as pg:  # the listener's connection cut
            pg.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%' AND datname = current_database()"
            )
        await until("the reconnection counted", lambda: (store.version() or 0) > (written or 0))
    finally:
        await store.close()


async def test_a_small_write_runs_inline_when_free_and_on_the_writer_when_locked(
    tmp_path: Path,
) -> None:
    """A small write (one event) skips the two thread hand-offs when the writer connection
    is free; while another process holds the write lock it never waits on the event loop:
    the writer thread takes it, and it commits once the lock is released."""
    store = await Store.open(tmp_path / "s.db")
    try:
        await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))

        assert threading.get_ident() == await store.write(on_thread(insert(1)), small=True)
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        pending = asyncio.ensure_future(store.write(on_thread(insert(2)), small=True))
        for _ in range(20):
            await asyncio.sleep(0.01)  # the loop runs on while the write waits
        assert not pending.done()
        other.execute("COMMIT")
        other.close()
        assert threading.get_ident() != await asyncio.wait_for(pending, 30)
        assert [(1,), (2,)] == await store.read(lambda c: c.execute("SELECT v FROM t").fetchall())
    finally:
        await store.close()


async def test_small_writes_that_arrive_together_share_the_writer(tmp_path: Path) -> None:
    """Of small writes that arrive in one pass of the event loop, the first runs inline and
    every other goes to the writer thread's group; in a later pass a write is alone again,
    and one task's writes in a row all run inline."""
    store = await Store.open(tmp_path / "s.db")
    try:
        await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
        loop_thread = threading.get_ident()

        threads = await asyncio.gather(
            *(store.write(on_thread(insert(v)), small=True) for v in range(10))
        )
        assert threads[0] == loop_thread
        assert loop_thread not in threads[1:]
        await asyncio.sleep(0)  # the next pass
        assert loop_thread == await store.write(on_thread(insert(10)), small=True)
        in_a_row = [await store.write(on_thread(insert(v)), small=True) for v in range(11, 14)]
        assert in_a_row == [loop_thread] * 3
        assert list(range(14)) == await store.read(
            lambda c: [v for (v,) in c.execute("SELECT v FROM t ORDER BY v")]
        )
    finally:
        await store.close()


async def test_a_postgresql_read_outlives_the_pools_connections_dying_idle(
    pg_server: PgServer,
) -> None:
    """When the server ends the pool's idle connections (a restart, an administrator), the
    next reads still answer: a read whose connection was dead is run again once, on a fresh
    one, as a write is. Seen in CI: a tick after the store came back failed on a reader
    connection left over from before the restart."""
    import psycopg

    target = pg_database(pg_server)
    store = await open_store(target, clock=now_ms)
    try:
        slow = "SELECT pg_sleep(0.5)"  # four at once: the readers' pool holds four
        await asyncio.gather(*(store.read(lambda c: c.execute(slow).fetchall()) for _ in range(4)))
        await store.write(lambda c: None)
        idle = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state = 'idle' AND query NOT LIKE 'LISTEN%'"
        )
        with psycopg.connect(target, autocommit=True) as pg:
            ended = pg.execute(f"SELECT pg_terminate_backend(pid) FROM ({idle}) AS i").fetchall()
            assert len(ended) >= 4
            await until("the ended connections gone", lambda: not pg.execute(idle).fetchall())
        for _ in range(4):
            assert [(1,)] == await store.read(lambda c: c.execute("SELECT 1").fetchall())
        await store.write(lambda c: None)
    finally:
        await store.close()


async def test_a_postgresql_store_answers_soon_after_the_server_comes_back(
    pg_server: PgServer,
) -> None:
    """While the server is down, each of a pool's connections tries to come back, waiting
    1, 2, 4, 8, 16 s between attempts. Once the server is back, a read must not wait out a
    wait that grew during the outage. Seen in CI: after a restart a write went through, and
    the tick's read that followed timed out, its pool's next attempts seconds away."""
    if pg_server.cluster is None:
        pytest.skip("the server is not ours to stop ($SESSIONWATCH_TEST_PG)")
    store = await open_store(pg_database(pg_server), clock=now_ms)
    one, slow = "SELECT 1", "SELECT pg_sleep(0.5)"
    try:
        await store.write(lambda c: None)  # the readers' pool holds four: each comes back alone
        await asyncio.gather(*(store.read(lambda c: c.execute(slow).fetchall()) for _ in range(4)))
        await asyncio.to_thread(pg_server.cluster.stop)
        try:
            for _ in range(4):  # 20 s down: unbounded, each next attempt would be past 27 s
                failed = await asyncio.gather(
                    *(store.read(lambda c: c.execute(one).fetchall()) for _ in range(6)),
                    return_exceptions=True,
                )
                assert all(isinstance(f, StoreError) for f in failed)
        finally:
            await asyncio.to_thread(pg_server.cluster.start)
        assert [(1,)] == await store.read(lambda c: c.execute(one).fetchall())
        await store.write(lambda c: None)
    finally:
        await store.close()
