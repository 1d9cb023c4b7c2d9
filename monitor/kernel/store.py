"""The state database: one SQLite file, one writer connection, one reader connection.

Every write is a plain synchronous function over a :class:`sqlite3.Connection`. Writes that
arrive while the writer is busy are folded into one ``BEGIN IMMEDIATE`` transaction (group
commit) on aiosqlite's connection thread, one savepoint each: a write that fails rolls back
alone and its caller gets its own error; the others commit together. Each write waits at
most ``write_timeout`` seconds for a lock held by another process (the busy timeout is set
per batch to what its oldest write has left), and then fails with :class:`StoreLocked`, so
a locked database costs every caller one bounded wait, not a queue of them.

Reads run on a separate read-only connection in a worker thread (or inline, for the API's
small point reads): a WAL reader never waits for the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from monitor.clock import Clock, now_ms
from monitor.errors import StoreError
from monitor.kernel.db import (
    BUSY_TIMEOUT_MS,
    _is_locked,
    _locked_error,
    _read_only,
    configure,
    data_version,
    make_private,
    open_path,
    run_read,
    translate,
    translated,
)
from monitor.kernel.schema import migrate

T = TypeVar("T")

MAX_GROUP = 64  # writes folded into one transaction at most


@dataclass(slots=True)
class _Write:
    fn: Callable[[sqlite3.Connection], Any]
    deadline: float  # time.monotonic() after which it no longer waits for a lock
    timeout: float  # how long that was, for the error
    future: asyncio.Future[Any]


Result = tuple[bool, Any]  # (ok, value or exception)


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
    conn: sqlite3.Connection, writes: list[_Write], results: list[Result | None], busy: BusyTimeout
) -> bool:
    """``BEGIN IMMEDIATE`` for the writes whose deadline has not passed; the others fail.
    False when none is left."""
    while True:
        now = time.monotonic()
        live = [i for i, w in enumerate(writes) if results[i] is None]
        for i in live:
            if writes[i].deadline <= now:
                results[i] = (False, _locked_error(writes[i].timeout))
        live = [i for i in live if results[i] is None]
        if not live:
            return False
        remaining = min(writes[i].deadline for i in live) - now
        busy.lower_to(conn, remaining)
        try:
            conn.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc):
                for i in live:
                    results[i] = (False, exc)
                return False


def run_group(
    conn: sqlite3.Connection, writes: list[_Write], busy: BusyTimeout | None = None
) -> list[Result]:
    """One transaction for several writes, a savepoint each (see the module docstring)."""
    results: list[Result | None] = [None] * len(writes)
    if not _begin(conn, writes, results, busy or BusyTimeout(ms=-1)):
        return [r for r in results if r is not None]
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
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        for j in done:
            results[j] = (False, exc)
    return [r if r is not None else (False, StoreError("write not run")) for r in results]


class Store:
    """The writer and reader connections to the state database, opened with :meth:`open`."""

    shared = False  # one host's file

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        clock: Clock,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._conn = conn
        self._reader: sqlite3.Connection | None = None  # inline point reads
        self._reader_lock = threading.Lock()
        self._bulk: sqlite3.Connection | None = None  # larger reads, in a worker thread
        self._bulk_lock = threading.Lock()
        self._busy = BusyTimeout()
        self._pending: list[_Write] = []
        self._drainer: asyncio.Task[None] | None = None
        self.path = path
        self.clock = clock
        self.write_timeout = BUSY_TIMEOUT_MS / 1000
        self.on_error = on_error  # counts failures (metrics)

    @classmethod
    async def open(
        cls, path: Path | str, *, clock: Clock = now_ms, on_error: Callable[[], None] | None = None
    ) -> Store:
        """Open (creating if needed) and migrate the database at ``path``."""
        db_path, created = open_path(path)
        try:
            conn = await aiosqlite.connect(str(db_path), check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the state database {db_path}: {exc}") from None
        store = cls(conn, db_path, clock, on_error)
        try:
            await store._call(configure)
            if created:
                make_private(db_path)
            await store.write(lambda c: migrate(c, clock()))
            if created:
                make_private(db_path)
            store._reader = _read_only(db_path)
            store._bulk = _read_only(db_path)
        except BaseException:
            await store.close()
            raise
        return store

    def _translated(self) -> contextlib.AbstractContextManager[None]:
        """sqlite3 errors leave the store as :class:`StoreError`, counted by ``on_error``."""
        return translated(self.on_error, self.write_timeout)

    def _translate(self, exc: BaseException) -> BaseException:
        return translate(exc, self.write_timeout, self.on_error)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        # aiosqlite runs ``fn`` on its connection thread.
        with self._translated():
            result: T = await self._conn._execute(fn, self._conn._conn, *args)  # type: ignore[no-untyped-call]
        return result

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one write (a savepoint in a group transaction) on the writer thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        timeout = self.write_timeout
        write = _Write(fn=fn, deadline=time.monotonic() + timeout, timeout=timeout, future=future)
        self._pending.append(write)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[:MAX_GROUP]
            del self._pending[:MAX_GROUP]
            try:
                results: list[Result] = await self._conn._execute(  # type: ignore[no-untyped-call]
                    run_group, self._conn._conn, batch, self._busy
                )
            except BaseException as exc:  # the connection itself failed
                results = [(False, exc)] * len(batch)
            for write, (ok, value) in zip(batch, results, strict=True):
                if write.future.done():
                    continue
                if ok:
                    write.future.set_result(value)
                else:
                    write.future.set_exception(self._translate(value))

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one read transaction on a read-only connection of its own, in a
        worker thread; it never waits for the writer, nor holds up the inline reads."""
        return await asyncio.to_thread(self._read_on, self._bulk_lock, "_bulk", fn)

    def read_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a small read inline on the read-only connection (the API's hot point reads,
        which cost less than the hop to a thread)."""
        return self._read_on(self._reader_lock, "_reader", fn)

    async def peek(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A small read: inline here (a PostgreSQL store awaits a round trip)."""
        return self.read_now(fn)

    def version(self) -> int:
        """Moves with every commit of another connection (``PRAGMA data_version`` of the
        reader): the service's writer, a CLI process, a gateway sharing the file."""
        return self.read_now(data_version)

    async def changed(self, timeout: float) -> None:
        """SQLite says no one when another process commits: wait ``timeout`` and look."""
        import asyncio

        await asyncio.sleep(timeout)

    def _read_on(self, lock: threading.Lock, name: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        with lock, self._translated():
            conn: sqlite3.Connection | None = getattr(self, name)
            if conn is None:
                raise StoreError("the state database is closed")
            return run_read(conn, fn)

    async def close(self) -> None:
        if self._drainer is not None and not self._drainer.done():
            with contextlib.suppress(BaseException):
                await self._drainer
        for lock, name in ((self._reader_lock, "_reader"), (self._bulk_lock, "_bulk")):
            with lock:
                conn = getattr(self, name)
                if conn is not None:
                    conn.close()
                    setattr(self, name, None)
        await self._conn.close()
