"""The state database: one SQLite file, one writer connection, two reader connections.

Every write is a plain synchronous function over a :class:`sqlite3.Connection`. The writer
connection has a thread of its own (the batching core, :class:`.batch.Batcher`): it takes
every write that is waiting, runs them as one ``BEGIN IMMEDIATE`` transaction (group
commit, :func:`run_group`, the SQLite half), hands the results back to the event loop in
one call, and goes straight on to the writes that arrived meanwhile. A write that fails
rolls back alone and its caller gets its own error; the others commit together. Each write
waits at most ``write_timeout`` seconds for a lock held by another process (the busy
timeout is set per group to what its oldest write has left), and then fails with
:class:`StoreLocked`, so a locked database costs every caller one bounded wait, not a
queue of them. A small write (one event) runs inline on the event loop instead when the
writer connection is free, no other process holds the lock (:class:`WriterConn`), and no
other task wrote inline in the same pass of the loop (:meth:`Store.write`).

Reads run on read-only connections of their own: a WAL reader never waits for the writer.
Small point reads run inline (the API's hot reads, which cost less than a thread hop);
larger ones on a connection of their own on a thread of its own (:class:`BulkReader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from monitor.clock import Clock, now_ms
from monitor.errors import StoreError
from monitor.kernel.store.batch import Batcher, Expired, PendingWrite, Result, live_writes
from monitor.kernel.store.sqlite_conn import (
    BUSY_TIMEOUT_MS,
    configure,
    data_version,
    finish_write,
    is_locked,
    locked_error,
    make_private,
    open_path,
    read_only,
    refused_open,
    run_read,
    translate,
    translated,
)
from monitor.kernel.store.sqlite_schema import SCHEMA_VERSION, migrate
from monitor.kernel.store.upgrade import say_upgraded
from monitor.lazylog import LazyLogger

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor import inotify

T = TypeVar("T")
log = LazyLogger(__name__)


@dataclass(slots=True)
class BusyTimeout:
    """The writer connection's busy timeout, lowered to what the oldest write has left in
    100 ms steps (rounded down, so no write waits past its deadline). It is set only when
    the step changes: the pragma is prepared anew for every value, and stays off the hot
    path."""

    ms: int = BUSY_TIMEOUT_MS

    def lower_to(self, conn: sqlite3.Connection, remaining: float) -> None:
        ms = int(remaining * 10) * 100 if remaining >= 0.1 else int(remaining * 1000)
        ms = max(1, ms)
        if ms != self.ms:
            conn.execute(f"PRAGMA busy_timeout = {ms}")
            self.ms = ms


def _begin(
    conn: sqlite3.Connection,
    writes: list[PendingWrite],
    results: list[Result | None],
    busy: BusyTimeout,
    expired: Expired | None,
) -> bool:
    """``BEGIN IMMEDIATE`` for the writes whose deadline has not passed; the others fail,
    and are told at once through ``expired`` (not when the group ends: a write that came in
    early would otherwise wait for the deadline of the last one). False when none is left."""
    while True:
        live, remaining = live_writes(writes, results, locked_error, expired)
        if not live:
            return False
        busy.lower_to(conn, remaining)
        try:
            conn.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                for i in live:
                    results[i] = (False, exc)
                return False


def run_group(
    conn: sqlite3.Connection,
    writes: list[PendingWrite],
    busy: BusyTimeout | None = None,
    expired: Expired | None = None,
) -> list[Result]:
    """One transaction for several writes (see the module docstring).

    The writes run first without savepoints: nearly every group succeeds whole, and that
    is two statements fewer per write, each of which hands the GIL over and back. If one
    fails, the transaction is rolled back and the group runs again with a savepoint each,
    so the failing write rolls back alone. A write is a function of the database only, so
    running it again is running it once.
    """
    results: list[Result | None] = [None] * len(writes)
    busy = busy or BusyTimeout(ms=-1)
    if not _begin(conn, writes, results, busy, expired):
        return [r for r in results if r is not None]
    live = [i for i, r in enumerate(results) if r is None]
    try:
        values = [writes[i].fn(conn) for i in live]
    except BaseException:  # someone's own error: find whose, each in its savepoint
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if not _begin(conn, writes, results, busy, expired):
            return [r if r is not None else (False, StoreError("write not run")) for r in results]
        return _run_each(conn, writes, results)
    for i, value in zip(live, values, strict=True):
        results[i] = (True, value)
    return _commit(conn, live, results)


def _run_each(
    conn: sqlite3.Connection, writes: list[PendingWrite], results: list[Result | None]
) -> list[Result]:
    """The group's live writes, a savepoint each: one that fails rolls back alone."""
    done: list[int] = []
    for i, write in enumerate(writes):
        if results[i] is not None:
            continue
        conn.execute("SAVEPOINT write")
        try:
            results[i] = (True, write.fn(conn))
            conn.execute("RELEASE write")
            done.append(i)
        except BaseException as exc:
            results[i] = (False, exc)
            if not conn.in_transaction:  # SQLite rolled the whole transaction back
                for j in done:
                    results[j] = (False, exc)
                done = []
                break
            conn.execute("ROLLBACK TO write")
            conn.execute("RELEASE write")
    return _commit(conn, done, results)


def _commit(
    conn: sqlite3.Connection, done: list[int], results: list[Result | None]
) -> list[Result]:
    """Commit; if that fails, every write in ``done`` fails with it."""
    try:
        if conn.in_transaction:
            conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        for j in done:
            results[j] = (False, exc)
    return [r if r is not None else (False, StoreError("write not run")) for r in results]


def _alone(conn: sqlite3.Connection, write: PendingWrite) -> Result:
    try:
        return (True, write.fn(conn))
    except BaseException as exc:
        return (False, exc)


class Store:
    """The writer and reader connections to the state database, opened with :meth:`open`."""

    shared = False  # one host's file

    def __init__(
        self,
        writer: Batcher,
        inline: WriterConn,
        bulk: BulkReader,
        reader: sqlite3.Connection,
        path: str,
        clock: Clock,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._writer = writer
        self._inline = inline
        self._inline_task: object | None = None  # whose small write ran inline this pass
        self._queued = 0  # writes handed to the writer thread and not yet done
        self._bulk: BulkReader | None = bulk  # larger reads, on its own thread
        self._reader: sqlite3.Connection | None = reader  # inline point reads
        self._reader_lock = threading.Lock()
        self.path = path
        self.clock = clock
        self.write_timeout = BUSY_TIMEOUT_MS / 1000
        self.on_error = on_error  # counts failures (metrics)
        self._watch: inotify.Inotify | None = None  # the database's directory, once waited
        self._unwatched = False  # inotify refused: timeouts only

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = now_ms,
        on_error: Callable[[], None] | None = None,
    ) -> Store:
        """Open (creating if needed) and migrate the database at ``path``."""
        db_path, created = open_path(path)
        try:
            conn = sqlite3.connect(db_path, check_same_thread=False)
        except sqlite3.Error as exc:
            opened = StoreError(f"cannot open the state database {db_path}: {exc}")
            raise refused_open(db_path, opened) from None
        inline = WriterConn(conn)
        writer = _writer(inline, on_error)
        try:
            await writer.submit(lambda c: configure(c, clock), BUSY_TIMEOUT_MS / 1000, alone=True)
            if created:
                make_private(db_path)
            found = await writer.submit(lambda c: migrate(c, clock()), BUSY_TIMEOUT_MS / 1000)
            say_upgraded(db_path, found, SCHEMA_VERSION)
            if created:
                make_private(db_path)
            with translated(on_error):
                reader = read_only(db_path)
            try:
                bulk = await BulkReader.open(db_path)
            except BaseException:
                reader.close()
                raise
        except sqlite3.Error as exc:
            await writer.close()
            opened = StoreError(f"cannot open the state database {db_path}: {exc}")
            raise refused_open(db_path, opened) from None
        except BaseException as exc:
            await writer.close()
            raise refused_open(db_path, exc) from None
        return cls(writer, inline, bulk, reader, db_path, clock, on_error)

    @property
    def queued(self) -> int:
        """Writes handed to the writer thread and not yet done (they join its next group)."""
        return self._queued

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, small: bool = False) -> T:
        """Run ``fn`` as one write (a savepoint in a group transaction) on the writer thread.

        A ``small`` one runs inline, saving two thread hand-offs, when it is alone: nothing
        is queued for the writer thread, the connection is free (see
        :meth:`WriterConn.try_inline`), and no other task wrote inline in this pass of the
        event loop. Requests that arrive together run in one pass: the first writes inline,
        and every other joins the writer's group commit, which serves many far better than
        one commit each on the loop (50 clients: half the throughput, before). A lone client
        pays nothing for that: its next request comes in a later pass. The same task may
        write inline again in one pass (nothing could join its writes, which are in order);
        one that writes in a loop and awaits nothing else holds the loop meanwhile, as any
        synchronous code does, and the kernel's callers write once a request. Before, every
        small write let the loop run once to find out, which cost the lone client about 6%
        of an event (``bench/kernel.py``)."""
        if small and not self._queued and not self._writer.closing:
            task = asyncio.current_task()
            if self._inline_task is None or self._inline_task is task:
                with translated(self.on_error):
                    ran, value = self._inline.try_inline(fn)
                if ran:
                    if self._inline_task is None:
                        self._inline_task = task
                        asyncio.get_running_loop().call_soon(self._next_pass)
                    return value  # type: ignore[return-value]  # ran: fn's own value
        self._queued += 1
        try:
            result: T = await self._writer.submit(fn, self.write_timeout)
        finally:
            self._queued -= 1
        return result

    def _next_pass(self) -> None:
        """Called soon after an inline write: the loop's next pass has begun."""
        self._inline_task = None

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one read transaction on a read-only connection of its own, on its
        own thread; it never waits for the writer, nor holds up the inline reads."""
        bulk = self._bulk
        if bulk is None:
            raise StoreError("the state database is closed")
        with translated(self.on_error):
            result: T = await bulk.run(fn)
        return result

    def read_now(self, fn: Callable[[sqlite3.Connection], T], *, single: bool = False) -> T:
        """Run a small read inline on the read-only connection (the API's hot point reads,
        which cost less than the hop to a thread). ``single``: ``fn`` runs one statement,
        which is a snapshot by itself, with no transaction around it."""
        with self._reader_lock, translated(self.on_error):
            if self._reader is None:
                raise StoreError("the state database is closed")
            return fn(self._reader) if single else run_read(self._reader, fn)

    async def peek(self, fn: Callable[[sqlite3.Connection], T], *, single: bool = False) -> T:
        """A small read: inline here (a PostgreSQL store awaits a round trip)."""
        return self.read_now(fn, single=single)

    def version(self) -> int | None:
        """Moves with every commit of another process (a CLI process, a gateway sharing the
        file), and never with this one's own: ``PRAGMA data_version`` of the writer
        connection, which moves with the commits of every connection but itself. None while
        a write holds the writer: the caller looks again shortly."""
        with translated(self.on_error):
            ran, value = self._inline.try_peek(data_version)
        return value if ran else None

    def heard(self) -> None:
        """SQLite says only that another process committed, never what."""
        return None

    def announce(self, conn: object, topics: frozenset[str]) -> None:
        """Nothing to carry it: ``data_version`` is a count."""

    async def changed(self, timeout: float) -> bool:
        """Until another process may have committed, at the latest after ``timeout`` s.
        SQLite says no one; on Linux the kernel does: the database file or its WAL was
        written (inotify on their directory, on the event loop). Elsewhere: ``timeout``.
        True when told of a write: which may not be visible yet (a commit's frames are
        written to the WAL before its index says so: see
        :data:`monitor.kernel.changes.VISIBLE_AFTER_S`)."""
        armed = self._watch is not None
        watch = self._file_watch()
        if watch is None:
            await asyncio.sleep(timeout)
            return False
        if not armed:  # a write before the watch was armed is not told: the caller looks now
            await asyncio.sleep(0)
            return False
        from monitor import inotify

        real = os.path.realpath(self.path)  # written there, whatever path names it
        names = {real, f"{real}-wal"}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                try:
                    while not names & await watch.changed():
                        pass
                    return True
                except inotify.Ended:
                    self._close_watch()  # the next wait watches again; this one looks now
        return False

    @property
    def watches_changes(self) -> bool:
        """Whether :meth:`changed` is told of writes (so its waits may be long)."""
        return self._file_watch() is not None

    def _file_watch(self) -> inotify.Inotify | None:
        if self._watch is None and not self._unwatched:
            from monitor import inotify  # the service's: one-shot commands never wait

            try:
                watch = inotify.Inotify()
                watch.watch_dir(os.path.dirname(os.path.realpath(self.path)), inotify.CHANGES)
            except OSError as exc:  # not Linux, or no watches left: a look per timeout
                log.debug("the database's directory is not watched: %s", exc)
                self._unwatched = True
                return None
            self._watch = watch
        return self._watch

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    async def start(self, stack: AsyncExitStack, bus: object) -> None:
        """A part of the service: closed when ``stack`` closes, after every part started
        after it stopped."""
        stack.push_async_callback(self.close)

    async def close(self) -> None:
        self._close_watch()
        await self._writer.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        bulk, self._bulk = self._bulk, None
        if bulk is not None:
            await bulk.close()


class BulkReader:
    """A read-only connection for larger reads, used on one thread of its own, one read at a
    time; the event loop awaits it. (It was aiosqlite's connection thread, reached through
    a private method of aiosqlite; a one-thread executor does the same through public API.)"""

    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._executor = executor

    @classmethod
    async def open(cls, path: str) -> BulkReader:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessionwatch-read")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, read_only, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(conn, executor)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, run_read, self._conn, fn)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


class WriterConn:
    """The writer connection, used under one lock: the writer thread runs its groups on it
    (:meth:`group`), and a small write runs inline on the event loop when nothing else
    holds it (:meth:`try_inline`), which saves the lone write its two thread hand-offs."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.busy = BusyTimeout()
        self.closed = False

    def group(self, writes: list[PendingWrite], expired: Expired) -> list[Result]:
        with self.lock:
            return run_group(self.conn, writes, self.busy, expired)

    def alone(self, write: PendingWrite) -> Result:
        with self.lock:
            return _alone(self.conn, write)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.conn.close()

    def try_peek(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """``fn`` on the connection now, outside a transaction, if nothing holds it (a
        pragma: it never waits on another process); ``(False, None)`` when something does."""
        if not self.lock.acquire(blocking=False):
            return False, None
        try:
            return (False, None) if self.closed else (True, fn(self.conn))
        finally:
            self.lock.release()

    def try_inline(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """Run ``fn`` as one transaction now, if the connection is free and no other
        process holds the write lock (it waits 1 ms at most, so the loop never waits on
        another process); ``(False, None)`` when it did not run, and the writer thread
        takes it. ``fn``'s own error, and a failure of the database, are raised."""
        if not self.lock.acquire(blocking=False):
            return False, None
        try:
            if self.closed:
                return False, None
            conn = self.conn
            self.busy.lower_to(conn, 0.0)
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if is_locked(exc):
                    return False, None
                raise
            return True, finish_write(conn, fn)
        finally:
            self.lock.release()


def _writer(writer: WriterConn, on_error: Callable[[], None] | None) -> Batcher:
    """The writer connection's thread: group commit (:func:`run_group`) through the one
    batching core, with SQLite's errors made ours."""
    return Batcher(
        writer.group,
        lambda exc, waited: translate(exc, waited, on_error),
        run_alone=writer.alone,
        on_close=writer.close,
    )
