"""What the SQL modules need of a database connection, whichever the store.

Every table's SQL is written once, with ``?`` (or ``:name``) placeholders, in the dialect
SQLite and PostgreSQL share (``ON CONFLICT``, ``RETURNING``, ``IS DISTINCT FROM``, ``CASE``
rather than two-argument ``max``, ``CAST`` for a parameter whose type is only known by
its use). SQLite runs it as it is; :class:`monitor.kernel.store.postgres.PgConn` rewrites the
placeholders for psycopg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from monitor.clock import Clock

if TYPE_CHECKING:
    from contextlib import AsyncExitStack


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor: ...


T = TypeVar("T")

# The store's clock in SQL: ms since the epoch, read where the statement runs. SQLite (one
# host's file) answers with the store's ``clock`` (the host's, or a test's); PostgreSQL with
# the server's ``clock_timestamp()``, so that several hosts compare one clock, whatever
# theirs says (a test's clock stands in for it when given).
NOW_SQL = "sw_now()"


def store_now(conn: Conn) -> int:
    """The store's clock, read in the transaction at hand: after its lock is taken (SQLite's
    ``BEGIN IMMEDIATE``, PostgreSQL's write lock), so a write that waited for it stamps the
    time it runs, not the time it was asked for. What a lease's expiry and a wake's window
    are written and compared with (:mod:`monitor.kernel.leases`,
    :mod:`monitor.delivery.claims`)."""
    return int(conn.execute(f"SELECT {NOW_SQL}").fetchone()[0])


class StateStore(Protocol):
    """What the kernel needs of a store. Three implement it: :class:`.sqlite.Store`
    (SQLite, the service: group commit on a writer thread), :class:`.sqlite_conn.DirectStore`
    (SQLite, one-shot commands: on the calling thread) and :class:`.postgres.PgStore`
    (PostgreSQL, shared by several sidecars). ``tests/kernel/test_store_contract.py`` holds
    each to what is said here.

    A transaction function (``fn``) is synchronous and takes a :class:`Conn`; it must be a
    function of the database only, because **a write may run twice**: a group whose write
    failed runs again with a savepoint each, and a connection that broke before it did
    anything is retried. Its second run sees the database as its first did, so running it
    again is running it once; it must not count, log or send anything itself (return what
    happened, and act on it after the write returns)."""

    clock: Clock  # the store's clock (ms since the epoch), what the kernel stamps rows with
    on_error: Callable[[], None] | None  # called on every store failure (the metrics count)
    shared: bool  # several sidecars (on several hosts) may use it

    @property
    def watches_changes(self) -> bool:
        """Whether :meth:`changed` is told of other processes' commits as they happen (its
        timeout is then a safety net, not the pace of a poll)."""
        ...

    @property
    def path(self) -> str:
        """What messages name the store by: the SQLite file, or the URL without password."""
        ...

    async def write(self, fn: Callable[[Conn], T], *, small: bool = False) -> T:
        """Run ``fn`` as one write transaction (or a savepoint in a group transaction that
        commits before this returns) and return its value. ``fn``'s own exception is
        raised as it is, and rolls back only ``fn``'s writes. A lock held by another
        process is waited for at most the store's write timeout, then
        :class:`~monitor.errors.StoreLocked`; any other store failure is a
        :class:`~monitor.errors.StoreError`. ``small``: a short write (one event) that a
        store may run inline on the event loop when it would not wait there. ``fn`` may run
        more than once (see above)."""
        ...

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` on one read snapshot, off the event loop (a larger read); it never
        waits for a writer. Store failures are :class:`~monitor.errors.StoreError`."""
        ...

    async def peek(self, fn: Callable[[Conn], T], *, single: bool = False) -> T:
        """A small read on one snapshot: inline where that costs less than a thread hop
        (SQLite), else as :meth:`read`. ``single``: ``fn`` runs one statement, a snapshot
        by itself, so the store may leave out the transaction around it."""
        ...

    def version(self) -> int | None:
        """A counter that moves with every commit of another process, never with this
        store's own (SQLite's ``PRAGMA data_version`` of the writer connection, PostgreSQL's
        change notices of other stores): compared, never interpreted. None when it cannot be
        read at once (a write holds the connection): look again shortly."""
        ...

    async def changed(self, timeout: float) -> bool:
        """Return when a change may have happened, at the latest after ``timeout`` s (at
        once on PostgreSQL's notice; SQLite says no one, so it waits and looks): True when
        told of one, False when the time ran out."""
        ...

    def heard(self) -> frozenset[str] | None:
        """What the other processes' commits heard since the last call touched
        (:mod:`monitor.kernel.topics`); None: anything may have (SQLite cannot say)."""
        ...

    def announce(self, conn: Conn, topics: frozenset[str]) -> None:
        """Inside a write, on its ``conn``: what it touched, for the other processes to hear
        once it committed (nothing, on a store whose version says no more than a count)."""
        ...

    async def start(self, stack: AsyncExitStack, bus: object) -> None:
        """As a part of the service: closed when ``stack`` closes."""
        ...

    async def close(self) -> None:
        """Finish the writes already submitted, then close every connection. Later calls
        fail with :class:`~monitor.errors.StoreError`."""
        ...
