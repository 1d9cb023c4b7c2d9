"""The state database: one SQLite file, one writer connection.

Every write is a plain synchronous function over a :class:`sqlite3.Connection` that
:meth:`Store.write` runs inside ``BEGIN IMMEDIATE`` on aiosqlite's connection thread, so a
whole transaction crosses to the database thread once instead of once per statement.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from monitor.clock import Clock, now_ms
from monitor.errors import SessionwatchError, StoreError
from monitor.schema import migrate

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000


def configure(conn: sqlite3.Connection) -> None:
    """The pragmas every sessionwatch connection runs with."""
    conn.isolation_level = None  # transactions are explicit
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"could not switch the state database to WAL mode (got {mode})")
    conn.execute("PRAGMA synchronous = NORMAL")


def run_write(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction; roll back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def run_read(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in one read transaction, so it sees a single snapshot."""
    conn.execute("BEGIN")
    try:
        return fn(conn)
    finally:
        conn.execute("COMMIT")


class Store:
    """The one connection to the state database, opened with :meth:`open`."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, clock: Clock) -> None:
        self._conn = conn
        self._reader: sqlite3.Connection | None = None
        self.path = path
        self.clock = clock
        self.on_error: Callable[[], None] | None = None  # counts failures (metrics)

    @classmethod
    async def open(cls, path: Path | str, *, clock: Clock = now_ms) -> Store:
        """Open (creating if needed) and migrate the database at ``path``."""
        db_path = Path(path).expanduser()
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = await aiosqlite.connect(str(db_path), check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the state database {db_path}: {exc}") from exc
        store = cls(conn, db_path, clock)
        try:
            await store._call(configure)
            await store.write(lambda c: migrate(c, clock()))
            store._reader = sqlite3.connect(str(db_path), check_same_thread=False)
            store._reader.isolation_level = None
            store._reader.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            store._reader.execute("PRAGMA query_only = ON")
        except BaseException:
            await store.close()
            raise
        return store

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """sqlite3 errors leave the store as :class:`StoreError`, counted by ``on_error``."""
        try:
            yield
        except SessionwatchError:
            raise
        except sqlite3.Error as exc:
            if self.on_error:
                self.on_error()
            raise StoreError(f"state database error: {exc}") from exc

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        # aiosqlite runs ``fn`` on its connection thread; this is the one place that uses it.
        with self._translated():
            result: T = await self._conn._execute(fn, self._conn._conn, *args)  # type: ignore[no-untyped-call]
        return result

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one write transaction on the database thread."""
        return await self._call(run_write, fn)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one read transaction on the database thread."""
        return await self._call(run_read, fn)

    def read_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a small read inline on a separate read-only connection.

        WAL readers never wait for the writer, and a point read costs less than the hop to
        the database thread; only the hot, bounded reads of the API use this.
        """
        if self._reader is None:
            raise StoreError("the state database is closed")
        with self._translated():
            return run_read(self._reader, fn)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        await self._conn.close()
