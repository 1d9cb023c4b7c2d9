"""The state database on PostgreSQL (``postgresql://...``), for several sidecars on several
hosts sharing one store.

The kernel's transaction functions are the same synchronous functions as on SQLite; here
each runs on a pooled psycopg connection in a worker thread (``psycopg_pool``).

- **Writes** take a transaction-scoped advisory lock first (``pg_advisory_xact_lock``): one
  writer at a time across every process and host, which is SQLite's ``BEGIN IMMEDIATE``
  discipline. Under that lock, at ``READ COMMITTED``, each write sees every earlier commit,
  so the invariants proven for SQLite hold as they are: sequences are assigned and committed
  in one order (a reader of ``changesSince`` never sees a later sequence before an earlier
  one), heads only rise, a cursor's freeze and acknowledgement are compare-and-set, and a
  link's marker moves only with its event. Writes are few and short (an event, a tick's
  settle), so one at a time costs little; ``bench/hosts.py`` measures it.
- **Reads** run at ``REPEATABLE READ, READ ONLY``: one snapshot per read, as on SQLite.
- **Change notices**: a transaction whose writes touched what another process acts on
  ends with ``pg_notify('sessionwatch', <this store's token> <its topics>)``
  (:mod:`monitor.kernel.topics`; one per group commit, a write rolled back names nothing);
  PostgreSQL delivers it on commit, and a ``LISTEN`` connection counts those of other
  stores (other processes, other hosts) in :meth:`PgStore.version` and gathers their
  topics for :meth:`PgStore.heard`, as SQLite's writer connection counts the commits of
  other connections: this process's own commits are published by the kernel as they
  happen. A write that touched nothing another process acts on (a lease renewed, a step of
  the wake ledger) tells no one, so hosts do not wake one another for their upkeep. A
  notice without topics (a release before them) means anything may have moved.
- **Group commit**: writes that arrive while a transaction runs share the next one, a
  savepoint each (a write that fails rolls back alone), as on SQLite: one lock per batch.
  A write waits for the lock at most ``write_timeout`` from its call (the batch's lock wait
  is bounded by its oldest write's time left, and a write whose time is up fails at once),
  so a lock held elsewhere costs each caller one bounded wait, as on SQLite.
- **Faults**: psycopg's errors leave as :class:`StoreError` (a write answers 503, a tick
  keeps its markers). A connection found dead before a write did anything is dropped and
  the write retried once on a fresh one; the pool reconnects with backoff, and so does the
  listener (which counts a reconnection as a change: notifications may have been missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from monitor.clock import Clock, now_ms
from monitor.config import without_password
from monitor.errors import SessionwatchError, StoreError, StoreLocked, StoreUnavailable
from monitor.kernel.store.batch import Batcher, Expired, PendingWrite, Result, live_writes
from monitor.kernel.store.pg_schema import migrate, schema_version
from monitor.kernel.store.protocol import NOW_SQL
from monitor.kernel.store.sqlite_schema import SCHEMA_VERSION
from monitor.kernel.store.upgrade import refuse_under_serve, running_serves, say_upgraded
from monitor.pulse import Pulse
from monitor.retry import Backoff

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.kernel.store.protocol import Conn, Cursor
    from monitor.kernel.topics import Topics

log = logging.getLogger(__name__)
# The pool says every failed connection attempt; the store says an outage once (below).
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

T = TypeVar("T")

WRITE_LOCK = 0x73776174  # "swat": the one advisory lock every write takes
CHANNEL = "sessionwatch"
NOTICE_BYTES = 7900  # a change notice's payload, at most (PostgreSQL's limit is 8000)
CONNECT_TIMEOUT_S = 5.0
WRITE_TIMEOUT_MS = 5000  # how long a write waits for the lock (another writer, another host)
# a writer's session idle this long in its transaction is ended by the server, and its lock
# with it: a host cut off (or stopped) while it holds the write lock frees it well within a
# peer's lock wait, by WRITE_TIMEOUT_MS - IDLE_IN_TRANSACTION_MS, never by chance (one value
# for both made a peer's write at the edge of a cut a 503 or not by a few ms either way)
IDLE_IN_TRANSACTION_MS = 2000
# A host cut off from the server mid-write (a partition: no FIN, no RST comes back) would
# hold the one write lock for as long as the cut lasts, and every other host's writes with
# it: the server ends a writer's session that sits idle in its transaction past
# IDLE_IN_TRANSACTION_MS (within any other writer's wait for the lock), which lets the lock
# go, and each
# connection gives up on a peer that stops acknowledging (TCP_USER_TIMEOUT) or answering
# keepalives, instead of the kernel's quarter of an hour.
DEAD_PEER: dict[str, Any] = {
    "tcp_user_timeout": 5000,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
}
# psycopg prepares a statement run five times on a connection, and PostgreSQL may then
# settle on a generic plan, one for any values: for changesSince that plan walks the whole
# log in sequence order to find a session with few events (7.5 ms at 50,000 rows, where a
# plan for the values at hand reads its two rows: bench/hosts.py (b)). Each statement is
# planned for its values, as an unprepared one is.
CUSTOM_PLANS = "-c plan_cache_mode=force_custom_plan"
LISTEN_BACKOFF_S = (0.2, 5.0)
FLAP_S = 5.0  # an outage said again this soon after it ended is said at INFO


@functools.lru_cache(maxsize=1024)
def _placeholders(sql: str, named: bool) -> str:
    """Our SQL's ``?`` (or ``:name``) placeholders as psycopg's ``%s`` (``%(name)s``)."""
    text = sql.replace("%", "%%")
    if named:
        return re.sub(r"(?<![:\w]):([a-z_]+)\b", r"%(\1)s", text)
    return text.replace("?", "%s")


# The server's clock, in ms: the store's clock that every host compares (NOW_SQL)
SERVER_NOW = "(extract(epoch from clock_timestamp()) * 1000)::bigint"


class PgConn:
    """A psycopg connection as the SQL modules use one (see :mod:`.protocol`); ``now``: what
    :data:`~monitor.kernel.store.protocol.NOW_SQL` reads (the server's clock, unless a test
    gives one of its own)."""

    __slots__ = ("_conn", "_now", "told")

    def __init__(
        self, conn: psycopg.Connection[Any], now: Callable[[], str] = lambda: SERVER_NOW
    ) -> None:
        self._conn = conn
        self._now = now
        self.told: set[str] = set()  # the write's topics (PgStore.announce)

    def execute(self, sql: str, parameters: Any = None, /) -> Cursor:
        named = isinstance(parameters, Mapping)
        text = _placeholders(sql, named)
        if NOW_SQL in text:
            text = text.replace(NOW_SQL, self._now())
        cursor: Cursor = self._conn.execute(text, parameters)
        return cursor

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        rows = list(parameters)
        cursor = self._conn.cursor()
        if rows:
            named = isinstance(rows[0], Mapping)
            cursor.executemany(_placeholders(sql, named), rows)
        return cursor


class PgStore:
    """The store interface of :class:`monitor.kernel.store.sqlite.Store`, on PostgreSQL."""

    def __init__(
        self,
        url: str,
        writers: ConnectionPool,
        readers: ConnectionPool,
        answers: ConnectionPool,
        clock: Clock,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self.path = without_password(url)  # what messages and ``status`` name the store by
        self.clock = clock
        # the store's clock in SQL: the server's, unless a clock of a test's was given
        self._now_sql: Callable[[], str] = (
            (lambda: SERVER_NOW) if clock is now_ms else (lambda: str(int(clock())))
        )
        self.on_error = on_error
        self.shared = True  # several sidecars may use this store
        self._up_at = -FLAP_S  # monotonic s when it last answered again after an outage
        self.watches_changes = False  # a NOTIFY wakes it; its poll stays the safety net
        self._writers = writers
        self._readers = readers
        self._answers = answers  # single statements (peek(single=True)): changesSince
        self._notices = Listener(url, self.path)  # other stores' commits
        self._down = False  # an outage is said once, and its end once
        self._writer = Batcher(self._write_group, _as_is, name="sessionwatch-pg-writer")
        self.write_timeout = WRITE_TIMEOUT_MS / 1000  # a write's wait for the lock, at most

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        clock: Clock = now_ms,
        on_error: Callable[[], None] | None = None,
        one_shot: bool = False,
    ) -> PgStore:
        """Connect, create or migrate the schema, and start listening for changes.
        ``one_shot``: a command's, which does not upgrade a schema a running serve uses."""
        store = cls(url, *_pools(url), clock, on_error)
        try:
            await asyncio.to_thread(store._open_pools)
            found = await store.read(schema_version)
            if found < SCHEMA_VERSION:  # else opening writes nothing
                if one_shot:
                    serves = await store.read(running_serves)
                    refuse_under_serve(without_password(url), found, SCHEMA_VERSION, serves)
                await store.write(lambda conn: migrate(conn, clock()))
                say_upgraded(without_password(url), found, SCHEMA_VERSION)
            await store._notices.listen()
        except BaseException:  # the listener too, when opening is cancelled while it waits
            await store.close()
            raise
        store._notices.opened = True
        return store

    def _open_pools(self) -> None:
        """One direct connection first, so that PostgreSQL's own reason (authentication
        failed, no such database, connection refused) is said at once; a pool only says it
        timed out."""
        try:
            psycopg.connect(
                self.url, connect_timeout=int(CONNECT_TIMEOUT_S), application_name="sessionwatch"
            ).close()
            for pool in self._pools:
                pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except (PoolTimeout, psycopg.Error) as exc:
            cause = without_password(" ".join(str(exc).split()))
            raise StoreError(f"cannot reach the state database {self.path}: {cause}") from None

    # -- the store interface -------------------------------------------------------------

    async def write(self, fn: Callable[[Conn], T], *, small: bool = False) -> T:
        """One write; writes that arrive while a group runs share the next transaction (a
        savepoint each: one that fails rolls back alone), so concurrent callers take the
        lock once per group, not once each. A write waits at most ``write_timeout`` for the
        lock, counted from its call, however long the group before it waited."""
        result: T = await self._writer.submit(fn, self.write_timeout)
        return result

    async def read(self, fn: Callable[[Conn], T]) -> T:
        return await asyncio.to_thread(self._read, fn)

    async def peek(self, fn: Callable[[Conn], T], *, single: bool = False) -> T:
        """``single``: one statement, its own snapshot, on a connection of the answers'
        pool (no transaction around it)."""
        return await asyncio.to_thread(self._read, fn, self._answers if single else self._readers)

    def version(self) -> int | None:
        """A counter that moves with every commit of another store that told something
        (see the module docstring); compared, never interpreted."""
        return self._notices.pulse.count

    async def changed(self, timeout: float) -> bool:
        """Return when a change is heard (True), or after ``timeout`` seconds."""
        seen = self._notices.pulse.count
        return await self._notices.pulse.after(seen, timeout) != seen

    def heard(self) -> Topics:
        return self._notices.heard()

    def announce(self, conn: Conn, topics: frozenset[str]) -> None:
        """Said with the transaction's change notice (``conn``: the write's)."""
        if isinstance(conn, PgConn):
            conn.told |= topics

    async def start(self, stack: AsyncExitStack, bus: object) -> None:
        """A part of the service: closed when ``stack`` closes, after every part started
        after it stopped."""
        stack.push_async_callback(self.close)

    async def close(self) -> None:
        """The writes in flight finish; then listening stops and the pools close."""
        await self._writer.close()
        await self._notices.close()
        await asyncio.to_thread(self._close_pools)

    def _close_pools(self) -> None:
        for pool in self._pools:
            with contextlib.suppress(Exception):
                pool.close(timeout=1.0)

    # -- transactions --------------------------------------------------------------------

    def _write_group(self, writes: list[PendingWrite], expired: Expired) -> list[Result]:
        """One transaction under the write lock, a savepoint per write; if the transaction
        itself fails, every write of it fails. The lock is waited for as long as the oldest
        write has left; a write whose time is up fails at once (through ``expired``) and
        the others wait on."""
        results: list[Result | None] = [None] * len(writes)
        retried = False
        while True:
            live, remaining = live_writes(writes, results, self._locked, expired)
            if not live:
                return [r for r in results if r is not None]
            wait_ms = max(1, int(remaining * 1000))
            locked = False
            try:
                with self._writers.connection(timeout=CONNECT_TIMEOUT_S) as conn:
                    try:
                        conn.execute(_lock_statement(wait_ms))
                    except psycopg.OperationalError:
                        if not retried and conn.broken:
                            raise _Retry from None  # dead before it did anything: once more
                        raise
                    locked = True
                    told: set[str] = set()
                    done = [(i, self._one(conn, writes[i].fn, told)) for i in live]
                    if told:  # delivered at commit
                        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self._notices.of(told)))
                # the pool's context manager committed
                self._up()
                for i, outcome in done:
                    results[i] = outcome
                return [r or (False, StoreError("write not run")) for r in results]
            except _Retry:
                retried = True
                self._writers.check()
            except psycopg.errors.LockNotAvailable as exc:
                if locked:  # a row lock inside a write: the transaction failed
                    return [r or (False, self._error(exc)) for r in results]
                # the oldest write's time is up: it fails (above), the others wait on
            except (psycopg.Error, PoolTimeout) as exc:  # nothing of the batch committed
                error = self._error(exc)
                return [r or (False, error) for r in results]

    def _one(
        self, conn: psycopg.Connection[Any], fn: Callable[[Conn], Any], told: set[str]
    ) -> Result:
        """One write in its savepoint, its topics added to ``told`` once it succeeded; a
        broken connection fails the whole batch."""
        try:
            with conn.transaction():
                pg = PgConn(conn, self._now_sql)
                result = (True, fn(pg))
            told |= pg.told
            return result
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            return (False, self._error(exc))
        except Exception as exc:  # the caller's own error (BadInput, a bug): its own
            return (False, exc)

    @property
    def _pools(self) -> tuple[ConnectionPool, ...]:
        return (self._writers, self._readers, self._answers)

    def _read(self, fn: Callable[[Conn], T], pool: ConnectionPool | None = None) -> T:
        """``fn`` in a read-only transaction. A read whose connection turns out dead (the
        server ended it while it sat idle in the pool: a restart, an administrator) runs
        once more on a fresh one, once the pool has let go of its other dead ones; a read
        changes nothing, so running it again is safe."""
        retried = False
        while True:
            try:
                with (pool or self._readers).connection(timeout=CONNECT_TIMEOUT_S) as conn:
                    try:
                        result = fn(PgConn(conn, self._now_sql))
                    except psycopg.OperationalError:
                        if not retried and conn.broken:
                            raise _Retry from None
                        raise
                self._up()
                return result
            except _Retry:
                retried = True
                (pool or self._readers).check()
            except SessionwatchError:
                raise
            except (psycopg.Error, PoolTimeout) as exc:
                raise self._error(exc) from exc

    def _locked(self, waited: float) -> StoreLocked:
        if self.on_error:
            self.on_error()
        return StoreLocked(
            "the state database's write lock is held by another sidecar"
            f" (waited {waited:.1f} s); try again"
        )

    def _error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return self._locked(self.write_timeout)
        if self.on_error:
            self.on_error()
        if isinstance(exc, PoolTimeout | psycopg.OperationalError):
            if not self._down:
                self._down = True
                # a connection that fails just after another answered is the same outage
                # ending (the pool's connections are tried one by one): said quietly
                flap = time.monotonic() - self._up_at < FLAP_S
                (log.info if flap else log.warning)(
                    "the state database %s is unavailable: %s", self.path, exc
                )
            return StoreUnavailable(f"the state database {self.path} is unavailable: {exc}")
        return StoreError(f"state database error: {exc}")

    def _up(self) -> None:
        if self._down:
            self._down = False
            self._up_at = time.monotonic()
            log.info("the state database %s answers again", self.path)


class Listener:
    """Other stores' change notices, on a ``LISTEN`` connection of its own: counted in
    ``pulse`` (the store's version), their topics gathered for :meth:`heard`; and this
    store's own notice, carrying its ``token`` (:meth:`of`)."""

    def __init__(self, url: str, path: str) -> None:
        self.url = url
        self.path = path
        self.pulse = Pulse()  # beats at every change of another store heard
        self.token = secrets.token_hex(8)  # this store's change notices carry it
        self.opened = False  # the store was handed out: a version may have been read
        self._topics: set[str] | None = set()  # what they touched, since heard() (None: any)
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()  # set once the first LISTEN is in place

    async def listen(self) -> None:
        """Listening before the store is handed out, so that the first version read is
        already heard from; past the wait, the listener counts its connection as a
        change."""
        self._task = asyncio.ensure_future(self._listen())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), CONNECT_TIMEOUT_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def of(self, topics: set[str]) -> str:
        """This store's notice of ``topics``: its token and the topics, one a line
        (anything, when too many to carry: PostgreSQL's payload is under 8000 bytes)."""
        payload = "\n".join((self.token, *sorted(topics)))
        return payload if len(payload.encode()) < NOTICE_BYTES else f"{self.token}\n*"

    def heard(self) -> Topics:
        """The topics of other stores' commits heard since the last call (None: anything
        may have moved: a notice without them, or a gap in listening)."""
        topics, self._topics = self._topics, set()
        return None if topics is None else frozenset(topics)

    def _bump(self, topics: list[str] | None) -> None:
        """On the event loop (the listener's task): count a change of what ``topics`` name
        (None: anything) and wake its waiters."""
        if topics is None or "*" in topics or self._topics is None:
            self._topics = None
        else:
            self._topics.update(topics)
        self.pulse.beat()

    async def _listen(self) -> None:
        backoff = Backoff(*LISTEN_BACKOFF_S)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=int(CONNECT_TIMEOUT_S),
                    **DEAD_PEER,  # a partition ends the listening too: heard as a change
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if self.opened:  # whatever happened while not listening
                        self._bump(None)
                    self._listening.set()
                    backoff.reset()
                    async for notice in conn.notifies():
                        token, _, topics = notice.payload.partition("\n")
                        if token != self.token:  # another store's commit
                            self._bump(topics.split("\n") if topics else None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if backoff.fresh:  # said once per outage
                    log.warning("listening for changes on %s failed: %s; retrying", self.path, exc)
            await backoff.wait()


def _pools(url: str) -> tuple[ConnectionPool, ConnectionPool, ConnectionPool]:
    """The writers', the readers' and the answers' pools, not yet open."""
    writers = _pool(
        url,
        4,
        options=f"-c lock_timeout={WRITE_TIMEOUT_MS}"
        f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} {CUSTOM_PLANS}",
    )
    readers = _pool(
        url,
        4,
        options="-c default_transaction_isolation=repeatable\\ read"
        f" -c default_transaction_read_only=on {CUSTOM_PLANS}",
    )
    # One statement a snapshot by itself (changesSince): no BEGIN and COMMIT around it
    answers = _pool(
        url, 2, autocommit=True, options=f"-c default_transaction_read_only=on {CUSTOM_PLANS}"
    )
    return writers, readers, answers


def _pool(url: str, size: int, **kwargs: Any) -> ConnectionPool:
    """A pool of up to ``size`` connections with ``kwargs``. A connection the pool lost is
    tried again after 1, 2, 4, 8 s...: during an outage of 20 s the next attempt is 16 s
    away, and once the server is back every caller would time out until then. Given up
    after CONNECT_TIMEOUT_S, the pool connects again as soon as a caller waits, so no
    caller waits past its own timeout."""
    return ConnectionPool(
        url,
        min_size=1,
        max_size=size,
        open=False,
        reconnect_timeout=CONNECT_TIMEOUT_S,
        kwargs={
            "connect_timeout": int(CONNECT_TIMEOUT_S),
            "application_name": "sessionwatch",
            **DEAD_PEER,
            **kwargs,
        },
    )


class _Retry(Exception):
    pass


def _as_is(exc: BaseException, waited: float) -> BaseException:
    """PostgreSQL's errors are made ours where they happen (``PgStore._error``)."""
    return exc


@functools.lru_cache(maxsize=256)
def _lock_statement(wait_ms: int) -> str:
    """The lock wait bounded to ``wait_ms`` and the lock, in one round trip (two statements
    need the simple query protocol: constants, no parameters)."""
    return f"SET LOCAL lock_timeout = {wait_ms}; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
