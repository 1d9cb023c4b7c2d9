"""Reading OpenCode's database: read-only connections kept per database and thread, the
batched query of the sessions' signals, and the export (messages and parts) of one session;
each query bounded in time, and a schema OpenCode moved said as drift
(:mod:`adapters.opencode` classifies what is read)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import orjson

from adapters.base import as_dict
from adapters.tailer import NotRegularFile, open_regular

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class UserMessage:
    """A user message with its parts, as stored (``data`` columns parsed)."""

    id: str
    parts: list[dict[str, Any]] = field(default_factory=list)


def open_readonly(db_path: str) -> sqlite3.Connection:
    if not os.path.exists(db_path):
        raise FileNotFoundError(db_path)
    conn = sqlite3.connect(
        f"file:{db_path}?mode=ro", uri=True, timeout=QUERY_TIMEOUT_S, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(QUERY_TIMEOUT_S * 1000)}")
    return conn


class _Held(NamedTuple):
    """A database's connection as :class:`Readers` holds it."""

    file: tuple[int, int]  # the device and inode it was opened on
    conn: sqlite3.Connection
    turn: threading.Lock  # one read at a time


class Readers:
    """One read-only connection per OpenCode database, kept open from read to read.

    The last connection to a WAL database to close locks it exclusively for a moment, to
    checkpoint its WAL away. ``opencode`` sets its journal mode before its busy timeout, so
    one that starts in that moment fails with "database is locked": a reader that opened
    and closed the database for each read made 3 of 15 ``opencode run`` fail; kept open,
    none. A connection is made again when the path names another file (device and inode:
    the one held open cannot be freed, so its number cannot come back) or a read failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    def run(self, db: str, query: Callable[[sqlite3.Connection], R]) -> R:
        """``query`` on ``db``'s connection, one read at a time. Raises FileNotFoundError
        (no database), OSError or ``sqlite3.Error``."""
        try:
            found = os.stat(db)
        except FileNotFoundError:
            self._drop(db)
            raise
        held = self._connection(db, (found.st_dev, found.st_ino))
        try:
            with held.turn:
                return query(held.conn)
        except sqlite3.Error as exc:
            if not str(exc).startswith(SCHEMA_DRIFT):  # drift stays until OpenCode changes
                self._drop(db, held)  # the next read opens it again
            raise

    def _connection(self, db: str, ident: tuple[int, int]) -> _Held:
        with self._lock:
            held = self._held.get(db)
            if held is not None and held.file == ident:
                return held
        if held is not None:
            self._drop(db, held)
        fresh = _Held(ident, open_readonly(db), threading.Lock())
        with self._lock:
            self._held.setdefault(db, fresh)
            kept = self._held[db]
        if kept is not fresh:  # another thread made one meanwhile
            fresh.conn.close()
        return kept

    def _drop(self, db: str, held: _Held | None = None) -> None:
        with self._lock:
            current = self._held.get(db)
            if current is None or (held is not None and current is not held):
                return
            del self._held[db]
        with current.turn:
            current.conn.close()


READERS = Readers()


def has_event_sequence(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'event_sequence'"
    ).fetchone()
    return row is not None


SCHEMA_DRIFT = ("no such table", "no such column")  # SQLite's words for a schema it lacks


def session_signals(conn: sqlite3.Connection, ids: list[str]) -> dict[str, tuple[Any, int]]:
    """One query for all linked sessions: id -> (parent id, change signal)."""
    marks = ",".join("?" * len(ids))
    if has_event_sequence(conn):
        sql = (
            "SELECT s.id, s.parent_id, es.seq FROM session s LEFT JOIN event_sequence es"
            f" ON es.aggregate_id = s.id WHERE s.id IN ({marks})"
        )
    else:
        sql = f"SELECT id, parent_id, time_updated FROM session WHERE id IN ({marks})"
    return {row[0]: (row[1], int(row[2] or 0)) for row in conn.execute(sql, ids)}


def session_version(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The OpenCode version that wrote the session (its ``version`` column), if kept."""
    try:
        row = conn.execute("SELECT version FROM session WHERE id = ?", (session_id,)).fetchone()
    except sqlite3.OperationalError:  # an older schema without the column
        return None
    return str(row[0]) if row and row[0] else None


def newest_message(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The id of the session's newest message of any role."""
    row = conn.execute("SELECT max(id) FROM message WHERE session_id = ?", (session_id,)).fetchone()
    return str(row[0]) if row and row[0] is not None else None


def export_user_messages(conn: sqlite3.Connection, session_id: str) -> list[UserMessage]:
    """The session's user messages with their parts, in creation order (short reads)."""
    return export_messages(conn, session_id)[0]


def export_messages(
    conn: sqlite3.Connection, session_id: str
) -> tuple[list[UserMessage], list[tuple[str, dict[str, Any]]]]:
    """The session's user messages with their parts, and every message's id and data
    (those that are JSON objects), in creation order (short reads)."""
    rows = conn.execute(
        "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id",
        (session_id,),
    ).fetchall()
    messages = [(str(m), found) for m, data in rows if (found := _object(data)) is not None]
    users = [m for m, data in messages if data.get("role") == "user"]
    parts: dict[str, list[dict[str, Any]]] = {m: [] for m in users}
    for message_id, data in conn.execute(
        "SELECT message_id, data FROM part WHERE session_id = ? ORDER BY id", (session_id,)
    ):
        value = _object(data) if message_id in parts else None
        if value is not None:
            parts[message_id].append(value)
    return [UserMessage(id=m, parts=parts[m]) for m in users], messages


def _object(data: Any) -> dict[str, Any] | None:
    """A row's JSON object (None: not JSON, or not an object)."""
    try:
        return as_dict(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """What a check reads of one session: its user messages with their parts, its newest
    message of any role, and the OpenCode version that wrote it."""

    messages: list[UserMessage]
    newest: str | None
    version: str | None
    # every message's id and data, in creation order: what the session is doing is read
    # from them (adapters.opencode)
    every: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class QueryFailed(Exception):
    """The database could not be read; ``drift``: OpenCode's schema is not the one known."""

    def __init__(self, reason: str, *, drift: bool = False) -> None:
        super().__init__(reason)
        self.drift = drift


def unopenable(path: str) -> str | None:
    """Why the file at ``path`` cannot be read (as the system says it: SQLite would say
    "unable to open database file" whatever the cause), or None."""
    try:
        fd, _ = open_regular(path)
    except NotRegularFile as exc:
        return str(exc)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    return None


def _failed(db: str, exc: OSError | sqlite3.Error) -> QueryFailed:
    """The failure as a link shows it: the system's reason for a file SQLite could not open
    (a FIFO, a folder, mode 000), never its "unable to open database file"."""
    drift = isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(SCHEMA_DRIFT)
    unopened = isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc)
    return QueryFailed((unopened and unopenable(db)) or str(exc), drift=drift)


R = TypeVar("R")


def _reading(db: str, query: Callable[[sqlite3.Connection], R]) -> R:
    """``query`` on the database opened read-only. Raises FileNotFoundError (no database)
    or :class:`QueryFailed`."""
    try:
        return READERS.run(db, query)
    except FileNotFoundError:
        raise
    except (OSError, sqlite3.Error) as exc:
        raise _failed(db, exc) from None


def read_signals(db: str, ids: list[str]) -> dict[str, tuple[Any, int]]:
    return _reading(db, lambda conn: session_signals(conn, ids))


def read_export(db: str, session_id: str) -> Export:
    def read(conn: sqlite3.Connection) -> Export:
        users, messages = export_messages(conn, session_id)
        return Export(
            messages=users,
            newest=newest_message(conn, session_id),
            version=session_version(conn, session_id),
            every=messages,
        )

    return _reading(db, read)
