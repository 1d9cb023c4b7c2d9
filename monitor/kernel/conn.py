"""What the SQL modules need of a database connection, whichever the store.

Every table's SQL is written once, with ``?`` (or ``:name``) placeholders, in the dialect
SQLite and PostgreSQL share (``ON CONFLICT``, ``RETURNING``, ``IS DISTINCT FROM``, ``CASE``
rather than two-argument ``max``, ``CAST`` for a parameter whose type is only known by
its use). SQLite runs it as it is; :class:`monitor.kernel.pg.PgConn` rewrites the
placeholders for psycopg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from monitor.clock import Clock


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


class StateStore(Protocol):
    """What the kernel needs of a store: :class:`monitor.kernel.store.Store` (SQLite, the
    service), :class:`monitor.kernel.db.DirectStore` (SQLite, one-shot commands) or
    :class:`monitor.kernel.pg.PgStore` (PostgreSQL, shared by several sidecars)."""

    clock: Clock
    on_error: Callable[[], None] | None
    shared: bool  # several sidecars (on several hosts) may use it

    @property
    def path(self) -> object: ...

    async def write(self, fn: Callable[[Conn], T]) -> T: ...

    async def read(self, fn: Callable[[Conn], T]) -> T: ...

    async def peek(self, fn: Callable[[Conn], T]) -> T: ...

    def version(self) -> int: ...

    async def changed(self, timeout: float) -> None: ...

    async def close(self) -> None: ...
