"""OpenCode's SQLite database (``opencode.db``): direct human turns, conservatively.

OpenCode's v1 tables keep no message origin, so ambiguous rows are not reported: only
non-synthetic, non-ignored text parts count, ``@file`` mention spans are cut out, messages
with a compaction part or a compaction-continue text are not turns, image- or file-only
turns are not turns, nor the shell sentinel, nor subtask parts. Text equal to any of the
session's previous 50 user messages is a compaction replay and is suppressed.

:func:`classify_user_messages` is pure; :class:`OpenCodeAdapter` holds the I/O: one batched
read-only query per database per tick, and an export (messages and parts) only for the
sessions whose event sequence advanced, at most 4 at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

import orjson

from adapters.base import (
    Adapter,
    DatabaseSource,
    Drift,
    Marker,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    Source,
    Turn,
    normalize_text,
    session_key_in,
    text_hash,
)
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id, id_digest
from monitor.errors import BadInput, Declined, OutsideRoots, Unreachable

log = logging.getLogger(__name__)

SHELL_SENTINEL = "The following tool was executed by the user"
REPLAY_LOOKBACK = 50
EXPORT_CONCURRENCY = 4
QUERY_TIMEOUT_S = 1.0
CHILD_SESSION = "an OpenCode child session (a sub-agent run) is not adoptable"
TESTED_VERSION = "1.18.33"  # the session ``version`` tests/harnesses drives
KNOWN_PART_TYPES = frozenset(
    {
        "text",
        "file",
        "agent",
        "subtask",
        "compaction",
        "tool",
        "reasoning",
        "step-start",
        "step-finish",
        "snapshot",
        "patch",
        "retry",
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class UserMessage:
    """A user message with its parts, as stored (``data`` columns parsed)."""

    id: str
    parts: list[dict[str, Any]] = field(default_factory=list)


def _cut_mentions(text: str, parts: list[dict[str, Any]]) -> str:
    """Remove ``@file``/``@agent`` mention spans (their ``source.text`` ranges) from text."""
    spans = []
    for part in parts:
        source = part.get("source")
        span = source.get("text") if isinstance(source, dict) else None
        if isinstance(span, dict):
            start, end = span.get("start"), span.get("end")
            if isinstance(start, int) and isinstance(end, int) and 0 <= start < end:
                spans.append((start, end))
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + text[end:]
    return text


def human_text(parts: list[dict[str, Any]]) -> str | None:
    """The typed text of a user message, or None when it is not a direct human turn."""
    texts: list[str] = []
    for part in parts:
        kind = part.get("type")
        if kind == "compaction":
            return None
        if kind != "text" or not isinstance(part.get("text"), str):
            continue
        metadata = part.get("metadata")
        if isinstance(metadata, dict) and metadata.get("compaction_continue"):
            return None
        if part.get("synthetic") is True or part.get("ignored") is True:
            continue
        texts.append(part["text"])
    if not texts:
        return None
    texts[0] = _cut_mentions(texts[0], parts)
    text = "\n".join(texts)
    if not normalize_text(text) or text.strip().startswith(SHELL_SENTINEL):
        return None
    return text


def replay_key(parts: list[dict[str, Any]]) -> str:
    """What a compaction replay is compared by: all text, attachments as placeholders."""
    pieces = []
    for part in parts:
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            if part.get("synthetic") is not True and part.get("ignored") is not True:
                pieces.append(part["text"])
        elif part.get("type") == "file":
            pieces.append(f"[Attached {part.get('mime', '')}: {part.get('filename', '')}]")
    return text_hash(" ".join(pieces))


@dataclass
class Classified:
    turns: list[Turn]
    consumed_to: str | None  # the newest user message consumed (turn or not)
    pending: bool  # a user message whose parts have not arrived yet stopped the scan
    compactions: list[str] = field(default_factory=list)  # native ids


def _may_still_grow(message: UserMessage, newest: str | None) -> bool:
    """No text part yet, and nothing newer in the session: its text may be on the way."""
    if any(p.get("type") == "text" for p in message.parts):
        return False
    return newest is None or newest <= message.id


def classify_user_messages(
    messages: list[UserMessage],
    after: str | None,
    own: OwnPool | None = None,
    lookback: int = REPLAY_LOOKBACK,
    newest: str | None = None,
) -> Classified:
    """Turns among the user messages after ``after`` (messages in creation order).

    Parts are written in stages, in their own transactions. A message with no text part yet
    and no newer message of any role (``newest``: the session's newest message id) stops the
    scan before it, so it is reported once, when its text arrives.
    """
    pool = own if own is not None else OwnPool()
    # Message ids ascend with time, so a consumed message that was since removed (a revert)
    # still tells where to resume.
    start = (
        0
        if after is None
        else next((i for i, m in enumerate(messages) if m.id > after), len(messages))
    )
    history = [replay_key(m.parts) for m in messages[:start]]
    turns: list[Turn] = []
    consumed = after
    compactions: list[str] = []
    for message in messages[start:]:
        if not message.parts or _may_still_grow(message, newest):
            return Classified(turns, consumed, pending=True, compactions=compactions)
        if any(p.get("type") == "compaction" for p in message.parts):
            compactions.append(f"opencode:{message.id}")
        key = replay_key(message.parts)
        text = human_text(message.parts)
        replayed = key in history[-lookback:]
        history.append(key)
        consumed = message.id
        if text is None or replayed:
            continue
        digest = text_hash(text)
        if not pool.consume(digest):
            turns.append(Turn(offset=None, native_id=message.id, text_hash=digest))
    return Classified(turns, consumed, pending=False, compactions=compactions)


# -- I/O --------------------------------------------------------------------------------


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


def part_drift(messages: list[UserMessage], version: str | None) -> Drift:
    """Part types of user messages no rule knows, and the session's declared version."""
    drift = Drift()
    if version:
        drift.see_version(version, TESTED_VERSION)
    for message in messages:
        for part in message.parts:
            kind = part.get("type")
            if kind not in KNOWN_PART_TYPES:
                drift.count_type(str(kind))
    return drift


def newest_message(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The id of the session's newest message of any role."""
    row = conn.execute("SELECT max(id) FROM message WHERE session_id = ?", (session_id,)).fetchone()
    return str(row[0]) if row and row[0] is not None else None


def export_user_messages(conn: sqlite3.Connection, session_id: str) -> list[UserMessage]:
    """The session's user messages with their parts, in creation order (short reads)."""
    rows = conn.execute(
        "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id",
        (session_id,),
    ).fetchall()
    users = []
    for message_id, data in rows:
        try:
            info = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(info, dict) and info.get("role") == "user":
            users.append(message_id)
    parts: dict[str, list[dict[str, Any]]] = {m: [] for m in users}
    for message_id, data in conn.execute(
        "SELECT message_id, data FROM part WHERE session_id = ? ORDER BY id", (session_id,)
    ):
        if message_id in parts:
            try:
                value = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                parts[message_id].append(value)
    return [UserMessage(id=m, parts=parts[m]) for m in users]


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """What a check reads of one session: its user messages with their parts, its newest
    message of any role, and the OpenCode version that wrote it."""

    messages: list[UserMessage]
    newest: str | None
    version: str | None


class QueryFailed(Exception):
    """The database could not be read; ``drift``: OpenCode's schema is not the one known."""

    def __init__(self, reason: str, *, drift: bool = False) -> None:
        super().__init__(reason)
        self.drift = drift


def _failed(exc: OSError | sqlite3.Error) -> QueryFailed:
    drift = isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(SCHEMA_DRIFT)
    return QueryFailed(str(exc), drift=drift)


R = TypeVar("R")


def _reading(db: str, query: Callable[[sqlite3.Connection], R]) -> R:
    """``query`` on the database opened read-only. Raises FileNotFoundError (no database)
    or :class:`QueryFailed`."""
    try:
        return READERS.run(db, query)
    except FileNotFoundError:
        raise
    except (OSError, sqlite3.Error) as exc:
        raise _failed(exc) from None


def read_signals(db: str, ids: list[str]) -> dict[str, tuple[Any, int]]:
    return _reading(db, lambda conn: session_signals(conn, ids))


def read_export(db: str, session_id: str) -> Export:
    return _reading(
        db,
        lambda conn: Export(
            messages=export_user_messages(conn, session_id),
            newest=newest_message(conn, session_id),
            version=session_version(conn, session_id),
        ),
    )


class LocalSessions:
    """Sessions in a database on this machine, read in a thread (short read-only queries)."""

    def __init__(self, default_db: str) -> None:
        self.default_db = default_db  # for refs without ``dbPath`` (OpenClaw writes ``{threadId}``)

    def where(self, ref: Ref) -> str:
        return str(ref.get("dbPath") or self.default_db)

    async def signals(self, where: str, ids: list[str]) -> dict[str, tuple[Any, int]]:
        return await asyncio.to_thread(read_signals, where, ids)

    async def export(self, where: str, session_id: str) -> Export:
        return await asyncio.to_thread(read_export, where, session_id)


class SessionReader(Protocol):
    """Where an OpenCode adapter reads sessions: a local database, or one on a paired node.
    Both raise FileNotFoundError (no database), :class:`QueryFailed`, or
    :class:`~monitor.errors.Unreachable` (a node that did not answer)."""

    def where(self, ref: Ref) -> str: ...

    async def signals(self, where: str, ids: list[str]) -> dict[str, tuple[Any, int]]: ...

    async def export(self, where: str, session_id: str) -> Export: ...


async def baseline_session(sessions: SessionReader, where: str, session_id: str) -> Marker:
    signals = await sessions.signals(where, [session_id])
    if session_id not in signals:
        raise Declined(f"no OpenCode session {session_id} in {where}")
    parent, seq = signals[session_id]
    if parent:
        raise Declined(CHILD_SESSION)
    messages = (await sessions.export(where, session_id)).messages
    return {"seq": seq, "lastHumanMessageId": messages[-1].id if messages else None}


class OpenCodeAdapter(DatabaseSource):
    """Checks linked OpenCode sessions; see the module docstring."""

    kind = "opencode"

    def __init__(
        self,
        *,
        concurrency: int = EXPORT_CONCURRENCY,
        lookback: int = REPLAY_LOOKBACK,
        default_db: str = "",
        sessions: SessionReader | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.lookback = lookback
        self.default_db = default_db
        self.sessions: SessionReader = (
            sessions if sessions is not None else LocalSessions(default_db)
        )
        self.exports = 0  # how many sessions were exported (observability, tests)

    async def baseline(self, ref: Ref) -> Marker:
        where, thread = self.sessions.where(ref), str(ref.get("threadId", ""))
        try:
            return await baseline_session(self.sessions, where, thread)
        except (OSError, QueryFailed, Unreachable) as exc:
            raise Declined(f"cannot read the OpenCode database {where}: {exc}") from None

    def resolve(self, path: str, thread: str | None) -> Source:
        """The configured database (no other), and a session id in it."""
        db = os.path.realpath(self.default_db)
        if os.path.realpath(path) != db:
            raise OutsideRoots(f"{path} is not the configured OpenCode database {db}")
        if not thread or not thread.strip():
            raise BadInput("an OpenCode adoption needs the session id (--thread)")
        return Source(ref={"dbPath": db, "threadId": thread.strip()}, thread_id=thread.strip())

    async def catalog(self) -> CatalogListing:
        return await asyncio.to_thread(scan_sessions, self.default_db)

    async def catalog_matching(self, digest: str) -> CatalogListing:
        """The entries whose id's digest starts with ``digest``: only their sessions'
        messages are counted."""
        return await asyncio.to_thread(scan_sessions, self.default_db, digest)

    def database(self, ref: Ref) -> str:
        return self.sessions.where(ref)

    def replay(self, path: str, thread: str | None, own_texts: list[str]) -> list[dict[str, Any]]:
        if not thread:
            raise BadInput("replay --adapter opencode needs --session SESSION_ID")
        return replay_session(path, thread, own_texts=own_texts, lookback=self.lookback)

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        by_db: dict[str, list[int]] = {}
        for i, probe in enumerate(probes):
            by_db.setdefault(self.sessions.where(probe.ref), []).append(i)
        outcomes: list[Outcome] = [Outcome(status="inconclusive")] * len(probes)
        gate = asyncio.Semaphore(self.concurrency)
        for db, indexes in by_db.items():
            await self._check_db(db, [probes[i] for i in indexes], indexes, outcomes, gate)
        return outcomes

    async def _check_db(
        self,
        db: str,
        probes: list[Probe],
        indexes: list[int],
        outcomes: list[Outcome],
        gate: asyncio.Semaphore,
    ) -> None:
        ids = [str(p.ref.get("threadId", "")) for p in probes]
        try:
            signals = await self.sessions.signals(db, ids)
        except FileNotFoundError:
            for i in indexes:
                outcomes[i] = Outcome(status="missing", reason="no such database")
            return
        except (OSError, QueryFailed, Unreachable) as exc:
            reason = f"query failed: {exc}"
            if isinstance(exc, QueryFailed) and exc.drift:
                # OpenCode migrated its own schema past what this reader knows: format drift,
                # never a missing session; the links wait, their markers kept
                reason = f"format drift: OpenCode's schema changed ({exc}); tested {TESTED_VERSION}"
            for i in indexes:
                outcomes[i] = Outcome(status="inconclusive", reason=reason)
            return

        async def one(i: int, probe: Probe, thread: str) -> None:
            if thread not in signals:
                outcomes[i] = Outcome(status="missing", reason="no such session")
                return
            seq = signals[thread][1]
            last = probe.marker.get("seq")
            last_seq = last if isinstance(last, int) else 0
            if seq == last_seq:
                outcomes[i] = Outcome(status="quiet", marker=probe.marker)
            elif seq < last_seq:
                marker = {**probe.marker, "seq": seq}
                outcomes[i] = Outcome(status="quiet", marker=marker, reason="sequence regressed")
            else:
                async with gate:
                    outcomes[i] = await self._export(db, thread, seq, probe)

        await asyncio.gather(*(one(i, p, t) for i, p, t in zip(indexes, probes, ids, strict=True)))

    async def _export(self, db: str, thread: str, seq: int, probe: Probe) -> Outcome:
        self.exports += 1
        try:
            export = await self.sessions.export(db, thread)
        except (OSError, QueryFailed, Unreachable) as exc:
            return Outcome(status="inconclusive", reason=f"export failed: {exc}")
        return self._classified(export, seq, probe)

    def _classified(self, export: Export, seq: int, probe: Probe) -> Outcome:
        messages = export.messages
        found = part_drift(messages, export.version)
        after = probe.marker.get("lastHumanMessageId")
        own = OwnPool(probe.own)
        result = classify_user_messages(
            messages, after if isinstance(after, str) else None, own, self.lookback, export.newest
        )
        # A half-written message keeps the sequence where it was, so the next tick looks again.
        marker = {
            "seq": probe.marker.get("seq", 0) if result.pending else seq,
            "lastHumanMessageId": result.consumed_to,
            "drift": found.to_json(),  # of the session as it stands (every export reads it all)
        }
        new_types = set(found.unknown_types) - set(
            Drift.from_json(probe.marker.get("drift")).unknown_types
        )
        for kind in sorted(new_types):
            log.warning(
                "%s: OpenCode part of unknown type %r (format drift?)", probe.session_key, kind
            )
        dedupe = result.turns[-1].native_id if result.turns else None
        return Outcome(
            status="activity",
            marker=marker,
            turns=result.turns,
            dedupe_id=dedupe,
            compactions=result.compactions,
            consumed_own=own.consumed,
            drift=found if new_types or found.newer else None,
        )


def build(settings: Settings) -> Adapter:
    return OpenCodeAdapter(
        concurrency=settings.export_concurrency,
        lookback=settings.replay_lookback,
        default_db=settings.root("opencode"),
    )


_SESSIONS = (
    "SELECT s.id, s.parent_id, s.directory, s.title, s.time_updated,"
    " (SELECT count(*) FROM message m WHERE m.session_id = s.id) FROM session s"
)


_NAMED = 500  # the most sessions read by their ids


def scan_sessions(db: str, digest: str | None = None) -> CatalogListing:
    """The database's root sessions (child sessions are sub-agent runs: skipped and
    counted); a missing database is an empty catalog, an unreadable one an error. With
    ``digest``, only those whose catalog id's digest starts with it (adoption by id: the
    ids are listed, and only those sessions read)."""
    catalog = CatalogListing()
    if not db or not os.path.isfile(db):
        return catalog
    real = os.path.realpath(db)

    def read(conn: sqlite3.Connection) -> list[Any]:
        if digest is None:
            return conn.execute(_SESSIONS).fetchall()
        ids = [sid for (sid,) in conn.execute("SELECT id FROM session")]
        named = [sid for sid in ids if id_digest(session_key_in(real, sid)).startswith(digest)]
        if len(named) > _NAMED:  # a prefix that short names many: read them all
            wanted = set(named)
            return [r for r in conn.execute(_SESSIONS) if r[0] in wanted]
        return conn.execute(
            f"{_SESSIONS} WHERE s.id IN ({','.join('?' * len(named))})", named
        ).fetchall()

    try:
        rows = READERS.run(real, read)
    except (OSError, sqlite3.Error) as exc:
        catalog.errors.append({"path": real, "reason": str(exc)})
        return catalog
    for sid, parent, directory, title, updated, messages in rows:
        if parent:
            catalog.skipped += 1
            continue
        catalog.entries.append(
            CatalogEntry(
                catalog_id=catalog_id("opencode", session_key_in(real, sid)),
                kind="opencode",
                native_id=sid,
                path=real,
                cwd=directory,
                title=title or None,
                updated_at=int(updated or 0),
                size=int(messages),
                size_unit="messages",
            )
        )
    return catalog


def replay_session(
    db_path: str, session_id: str, *, own_texts: list[str], lookback: int
) -> list[dict[str, Any]]:
    """``sessionwatch replay`` of one session: every user message through the classifier,
    writing nothing anywhere."""
    own = OwnPool.of_texts(own_texts)
    try:
        signals, messages, newest, version = READERS.run(
            db_path,
            lambda conn: (
                session_signals(conn, [session_id]),
                export_user_messages(conn, session_id),
                newest_message(conn, session_id),
                session_version(conn, session_id),
            ),
        )
    except (OSError, sqlite3.Error) as exc:
        raise BadInput(f"cannot read the OpenCode database {db_path}: {exc}") from None
    if session_id not in signals:
        raise BadInput(f"no OpenCode session {session_id} in {db_path}")
    if signals[session_id][0]:
        raise BadInput(CHILD_SESSION)
    result = classify_user_messages(messages, None, own, lookback, newest)
    out: list[dict[str, Any]] = [
        {"type": "turn", "offset": None, "id": t.native_id} for t in result.turns
    ]
    out.append(
        {
            "type": "summary",
            "humanTurns": len(result.turns),
            "compactions": len(result.compactions),
            "ticks": 1,
            "blocked": None,
            "drift": part_drift(messages, version).to_json(),  # as the other formats report it
            "marker": {"seq": signals[session_id][1], "lastHumanMessageId": result.consumed_to},
        }
    )
    return out
