"""The state database's plain SQLite layer, shared by both stores: the pragmas, one
transaction per write, read snapshots, private files, and errors as our own.

:class:`DirectStore` runs each call at once on the calling thread, for the one-shot CLI
commands (``status``, ``record``, ``notices``...): it needs neither asyncio nor a thread, so
a command starts in the time Python takes to import ``sqlite3``. Its methods are coroutines
that never suspend, so the kernel's async API runs on it unchanged (see :func:`run_now`).
The long-running service uses :class:`.sqlite.Store` (group commit on a writer thread).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Coroutine

from monitor.clock import Clock, now_ms
from monitor.errors import (
    ConfigError,
    SessionwatchError,
    StoreError,
    StoreLocked,
    StoreUnavailable,
)
from monitor.kernel.store.sqlite_schema import (
    SCHEMA_VERSION,
    migrate,
    read_schema_version,
    refuse_newer,
)
from monitor.kernel.store.sqlite_schema import made_by_sessionwatch as _only_ours
from monitor.paths import expand_user, make_private_dirs, refuse_if_not_ours

TYPE_CHECKING = False

if TYPE_CHECKING:
    from contextlib import AsyncExitStack
    from typing import Any, TypeVar

    from monitor.inotify import Inotify

    T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000
PRIVATE = 0o600


def configure(conn: sqlite3.Connection, clock: Clock = now_ms) -> None:
    """The pragmas every sessionwatch connection runs with, and the store's clock in SQL
    (:data:`~monitor.kernel.store.protocol.NOW_SQL`)."""
    conn.isolation_level = None  # transactions are explicit
    conn.create_function("sw_now", 0, lambda: int(clock()))
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    refuse_newer(conn)  # before WAL mode is set, which writes to the file
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"could not switch the state database to WAL mode (got {mode})")
    conn.execute("PRAGMA synchronous = NORMAL")
    # Statement and savepoint journals in memory: a write group never touches a temp file.
    conn.execute("PRAGMA temp_store = MEMORY")


def run_write(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction (see :func:`finish_write`)."""
    conn.execute("BEGIN IMMEDIATE")
    return finish_write(conn, fn)


def finish_write(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in the transaction just begun and commit it; on any exception, a failed
    commit included, roll back (so the connection never stays inside a transaction) and
    raise it."""
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return result


def migrate_without_waiting(conn: sqlite3.Connection, now: int) -> None:
    """Bring the schema up to date; a database already there is only read.

    The migration runs first in a deferred transaction that does not wait for a lock: on a
    current schema every statement is a no-op (``IF NOT EXISTS``), so it is a read and a
    one-shot command never waits for another process's write lock. Only when the schema
    needs a change and the lock is taken does it wait, as any write does."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("BEGIN")
        try:
            migrate(conn, now)
            conn.execute("COMMIT")
            return
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not is_locked(exc):
                raise
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    run_write(conn, lambda c: migrate(c, now))


def run_read(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in one read transaction, so it sees a single snapshot."""
    conn.execute("BEGIN")
    try:
        return fn(conn)
    finally:
        conn.execute("COMMIT")


def is_locked(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def locked_error(waited: float) -> StoreLocked:
    return StoreLocked(
        f"the state database is locked by another process (waited {waited:.1f} s); try again"
    )


def read_only(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.isolation_level = None
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = ON")
    return conn


def make_private(path: str) -> None:
    """The database and its WAL and SHM files: readable by their owner only."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", PRIVATE)


def translated(
    on_error: Callable[[], None] | None = None, waited: float = BUSY_TIMEOUT_MS / 1000
) -> _Translated:
    """sqlite3 errors leave as :class:`StoreError` (:class:`StoreLocked` for a lock)."""
    return _Translated(on_error, waited)


class _Translated:
    """:func:`translated`'s context. A class: a generator's context costs every read and
    write about 0.6 µs more (0.9 against 0.3 µs with a lock, Python 3.11)."""

    __slots__ = ("on_error", "waited")

    def __init__(self, on_error: Callable[[], None] | None, waited: float) -> None:
        self.on_error = on_error
        self.waited = waited

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, SessionwatchError):
            raise translate(exc, self.waited, self.on_error) from exc


def translate(
    exc: BaseException, waited: float, on_error: Callable[[], None] | None = None
) -> BaseException:
    if isinstance(exc, SessionwatchError) or not isinstance(exc, sqlite3.Error):
        return exc
    if on_error:
        on_error()
    if is_locked(exc):
        return locked_error(waited)
    if isinstance(exc, sqlite3.OperationalError | sqlite3.InternalError) or type(exc) is (
        sqlite3.DatabaseError
    ):  # full, read-only, I/O, corrupt: every write would fail the same way
        return StoreUnavailable(f"state database error: {exc}")
    return StoreError(f"state database error: {exc}")  # this write's own: a constraint


def open_path(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """The database path, its directory created private; and whether the file is new. A
    path that holds anything but a regular file (a device, a FIFO, a directory) is refused
    before SQLite opens it: SQLite would create its journal beside it (``/dev/null-journal``)."""
    db_path = expand_user(path)
    try:
        make_private_dirs(os.path.dirname(db_path) or ".")
        mode = os.stat(db_path).st_mode
    except FileNotFoundError:
        return db_path, True
    except OSError as exc:
        raise StoreError(f"cannot open the state database {db_path}: {exc}") from None
    if not stat.S_ISREG(mode):
        raise StoreError(f"cannot open the state database {db_path}: it is not a regular file")
    try:
        refuse_if_not_ours(db_path, "the state database")
    except ConfigError as exc:
        raise StoreError(str(exc)) from None
    return db_path, False


def why_not_opened(db_path: str) -> str | None:
    """Why SQLite could not open or write the database at ``db_path``, in words, with what
    to do, where SQLite says only "unable to open database file" (or "readonly", "disk I/O
    error"): a read-only mount, permissions, a full disk, a file that is not a database. None
    when none of them is the cause."""
    folder = os.path.dirname(os.path.abspath(db_path)) or "."
    try:
        fs = os.statvfs(folder)
    except OSError as exc:
        return f"its directory {folder} cannot be read: {exc.strerror}"
    if fs.f_flag & os.ST_RDONLY:
        return (
            f"{folder} is on a read-only file system, and SQLite writes its -wal and -shm files"
            " beside the database even to read it: mount it read-write, or copy the database"
            " to a writable place"
        )
    if os.path.exists(db_path) and not os.access(db_path, os.R_OK | os.W_OK):
        st = os.stat(db_path)
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        return f"this user may not read and write it (mode {mode}, owner uid {st.st_uid})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"this user may not write in {folder}, where SQLite keeps the -wal and -shm files"
    if fs.f_bavail == 0:
        return f"the disk holding {folder} is full: free space on it"
    if not _looks_like_sqlite(db_path):
        return "it is not a SQLite database"
    return None


def _looks_like_sqlite(db_path: str) -> bool:
    """An empty file (a database yet to be written), or one with SQLite's header."""
    try:
        with open(db_path, "rb") as f:
            head = f.read(16)
    except OSError:
        return True  # said by the checks before this one, or not the cause
    return not head or head == b"SQLite format 3\x00"


def refused_open(db_path: str, exc: BaseException) -> BaseException:
    """``exc`` from opening the database, or, where SQLite's own words do not say why, a
    :class:`StoreUnavailable` that does (see :func:`why_not_opened`)."""
    text = str(exc)
    vague = ("unable to open", "readonly", "disk I/O error", "not a database", "disk is full")
    if not isinstance(exc, StoreError | sqlite3.Error) or not any(v in text for v in vague):
        return exc
    why = why_not_opened(db_path)
    if why is None:
        return exc
    return StoreUnavailable(f"cannot open the state database {db_path}: {why}")


def made_by_sessionwatch(path: str | os.PathLike[str]) -> bool:
    """Whether sessionwatch made the database at ``path`` (see
    :func:`.sqlite_schema.made_by_sessionwatch`), read without writing; False for a file
    that cannot be read as a database."""
    # with no -wal nor -shm beside it, all it holds is in the file: read as immutable, the
    # read makes none (a WAL database's read would, with the database's own mode, and a
    # refused database would be left with them)
    alone = not any(os.path.lexists(f"{os.fspath(path)}{side}") for side in ("-wal", "-shm"))
    flags = "mode=ro&immutable=1" if alone else "mode=ro"
    try:
        conn = sqlite3.connect(f"file:{uri_path(os.fspath(path))}?{flags}", uri=True)
    except sqlite3.Error:
        return False
    try:
        return _only_ours(conn)
    except sqlite3.Error:
        return False
    finally:
        conn.close()


_URI_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/")


def uri_path(path: str) -> str:
    """``path`` percent-encoded for a ``file:`` URI, as ``urllib.parse.quote`` would
    (``urllib.parse`` costs a one-shot command a millisecond to import)."""
    return "".join(chr(b) if b in _URI_SAFE else f"%{b:02X}" for b in os.fsencode(path))


class DirectStore:
    """The state database on the calling thread (see the module docstring)."""

    shared = False  # one host's file
    watches_changes = False  # a one-shot command's wait sleeps and looks

    def __init__(self, conn: sqlite3.Connection, path: str, clock: Clock) -> None:
        self._conn: sqlite3.Connection | None = conn
        self.path = path
        self.clock = clock
        self.on_error: Callable[[], None] | None = None

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, clock: Clock = now_ms) -> DirectStore:
        db_path, created = open_path(path)
        try:
            conn = sqlite3.connect(db_path)
        except sqlite3.Error as exc:
            opened = StoreError(f"cannot open the state database {db_path}: {exc}")
            raise refused_open(db_path, opened) from None
        store = cls(conn, db_path, clock)
        try:
            with translated():
                configure(conn, clock)
                if created:
                    make_private(db_path)
                if not created:
                    _refuse_under_serve(conn, db_path)
                migrate_without_waiting(conn, clock())
                if created:
                    make_private(db_path)
        except BaseException as exc:
            await store.close()
            raise refused_open(db_path, exc) from None
        return store

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the state database is closed")
        return self._conn

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, small: bool = False) -> T:
        with translated(self.on_error):
            return run_write(self._live(), fn)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self.read_now(fn)

    def read_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read on the one connection, made read-only for its length (``query_only``),
        as the service store's reader connections are."""
        conn = self._live()
        with translated(self.on_error):
            conn.execute("PRAGMA query_only = ON")
            try:
                return run_read(conn, fn)
            finally:
                conn.execute("PRAGMA query_only = OFF")

    async def peek(self, fn: Callable[[sqlite3.Connection], T], *, single: bool = False) -> T:
        return self.read_now(fn)

    def version(self) -> int:
        """Moves with every commit of another connection (``PRAGMA data_version``)."""
        return self.read_now(data_version)

    def heard(self) -> None:
        """SQLite says only that another process committed, never what."""
        return None

    def announce(self, conn: object, topics: frozenset[str]) -> None:
        """Nothing to carry it: ``data_version`` is a count."""

    async def changed(self, timeout: float) -> bool:
        """SQLite says no one when another process commits: wait ``timeout`` and look. On
        the calling thread, as everything here (the coroutine never suspends)."""
        import time

        time.sleep(timeout)
        return False

    def watch(self) -> tuple[Inotify, set[str]] | None:
        """On Linux, an inotify watch of the database's directory and the paths in it that
        are the database (the file and its WAL), for a command that waits for other
        processes' commits (``notices --follow``); None where there is none."""
        from monitor import inotify

        if not inotify.available():
            return None
        real = os.path.realpath(self.path)
        try:
            watch = inotify.Inotify()
            watch.watch_dir(os.path.dirname(real))
        except OSError:
            return None
        return watch, {real, f"{real}-wal"}

    async def start(self, stack: AsyncExitStack, bus: object) -> None:
        """Closed when ``stack`` closes (one-shot commands close it themselves)."""
        stack.push_async_callback(self.close)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _refuse_under_serve(conn: sqlite3.Connection, db_path: str) -> None:
    """:class:`~.upgrade.SchemaInUse` for an older schema that a running ``serve`` uses (its
    host lease, or the live pid of its lock file): a one-shot command does not upgrade it."""
    found = read_schema_version(conn)
    if not 0 < found < SCHEMA_VERSION:
        return
    from pathlib import Path

    from monitor.kernel.store.upgrade import refuse_under_serve, running_serves
    from monitor.private import serving_pid

    serves = running_serves(conn)
    pid = serving_pid(Path(db_path))
    if pid is not None and not any(f":{pid}" in s for s in serves):
        serves.append(f"pid {pid}, from its lock file")
    refuse_under_serve(db_path, found, SCHEMA_VERSION, serves)


def data_version(conn: sqlite3.Connection) -> int:
    """SQLite's counter of commits by other connections (``PRAGMA data_version``)."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the kernel on a :class:`DirectStore`) without
    an event loop. One that suspends is a mistake of ours (the commands that need a loop are
    declared with ``loop=True`` in :mod:`monitor.cli`): it is closed and RuntimeError is
    raised."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("the coroutine suspended: run it with asyncio")
