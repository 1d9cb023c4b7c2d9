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
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapters.base import (
    Adapter,
    Boundary,
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
    as_dict,
    as_int,
    as_text,
    member,
    normalize_text,
    session_key_in,
    text_hash,
)
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id, id_digest, shown_path
from adapters.opencode_reads import (
    READERS,
    Export,
    QueryFailed,
    UserMessage,
    export_user_messages,
    newest_message,
    read_export,
    read_signals,
    session_signals,
    session_version,
    unopenable,
)
from adapters.states import WAITING, WORKING
from monitor.errors import BadInput, Declined, OutsideRoots, Unreachable

log = logging.getLogger(__name__)

SHELL_SENTINEL = "The following tool was executed by the user"
REPLAY_LOOKBACK = 50
EXPORT_CONCURRENCY = 4
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


def _cut_mentions(text: str, parts: list[dict[str, Any]]) -> str:
    """Remove ``@file``/``@agent`` mention spans (their ``source.text`` ranges) from text."""
    spans = []
    for part in parts:
        source = part.get("source")
        span = member(source, "text")
        if isinstance(span, dict):
            start, end = span.get("start"), span.get("end")
            if isinstance(start, int) and isinstance(end, int) and 0 <= start < end:
                spans.append((start, end))
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + text[end:]
    return text


def human_text(parts: list[dict[str, Any]]) -> str | None:
    """The typed text of a user message, or None when it is not a direct human turn."""
    if any(_compaction_part(part) for part in parts):
        return None
    texts = [part["text"] for part in parts if _typed_text(part)]
    if not texts:
        return None
    texts[0] = _cut_mentions(texts[0], parts)
    text = "\n".join(texts)
    if not normalize_text(text) or text.strip().startswith(SHELL_SENTINEL):
        return None
    return text


def _compaction_part(part: dict[str, Any]) -> bool:
    """A compaction, or the text that continues one: the message is no turn at all."""
    if part.get("type") == "compaction":
        return True
    metadata = part.get("metadata")
    return (
        part.get("type") == "text"
        and isinstance(part.get("text"), str)
        and isinstance(metadata, dict)
        and bool(metadata.get("compaction_continue"))
    )


def _typed_text(part: dict[str, Any]) -> bool:
    """A text part a person typed (not one the harness made or set aside)."""
    return (
        part.get("type") == "text"
        and isinstance(part.get("text"), str)
        and part.get("synthetic") is not True
        and part.get("ignored") is not True
    )


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


def _resume_at(messages: list[UserMessage], after: str | None) -> int:
    """The first message after ``after``. Message ids ascend with time, so a consumed
    message that was since removed (a revert) still tells where to resume."""
    if after is None:
        return 0
    return next((i for i, m in enumerate(messages) if m.id > after), len(messages))


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
    start = _resume_at(messages, after)
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
        replayed = key in history[-lookback:]
        history.append(key)
        consumed = message.id
        turn = None if replayed else _person_turn(message, pool)
        turns += [turn] if turn is not None else []
    return Classified(turns, consumed, pending=False, compactions=compactions)


def _person_turn(message: UserMessage, own: OwnPool) -> Turn | None:
    """A message's turn: its human text, unless it is none or the session's own coming
    back."""
    text = human_text(message.parts)
    digest = text_hash(text) if text is not None else None
    if digest is None or own.consume(digest):
        return None
    return Turn(offset=None, native_id=message.id, text_hash=digest)


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
        result = classify_user_messages(messages, as_text(after), own, self.lookback, export.newest)
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
        boundary = opencode_boundary(export.every, messages)
        return Outcome(
            status="activity",
            marker=marker,
            turns=result.turns,
            dedupe_id=dedupe,
            compactions=result.compactions,
            consumed_own=own.consumed,
            drift=found if new_types or found.newer else None,
            boundary=boundary,
        )


def message_state(data: dict[str, Any]) -> tuple[str, int | None] | None:
    """The state a message leaves its session in, and since when, as OpenCode 1.18.33
    writes them (tests/fixtures/states): a prompt, an assistant message not completed yet
    or one that called tools: working; one that finished (``stop``) or was aborted
    (``MessageAbortedError``): waiting. Another finish or error: no boundary (not seen)."""
    times = as_dict(data.get("time")) or {}
    created, completed = as_int(times.get("created")), as_int(times.get("completed"))
    role = data.get("role")
    if role == "user":
        return WORKING, created
    if role != "assistant" or data.get("summary") is True:  # a compaction's summary
        return None
    if completed is None:
        return WORKING, created
    aborted = member(data.get("error"), "name") == "MessageAbortedError"
    finish = data.get("finish")
    if aborted or finish == "stop":
        return WAITING, completed
    return (WORKING, completed) if finish == "tool-calls" else None


def message_state_wire(data: dict[str, Any]) -> dict[str, Any]:
    """What :func:`message_state` reads of a message (what a paired node sends): its role,
    times, finish, error's name and whether it is a summary; never its content."""
    times = as_dict(data.get("time")) or {}
    sent: dict[str, Any] = {"role": data.get("role")}
    sent["time"] = {k: times[k] for k in ("created", "completed") if k in times}
    if "finish" in data:
        sent["finish"] = data["finish"]
    if member(data.get("error"), "name") is not None:
        sent["error"] = {"name": member(data.get("error"), "name")}
    if data.get("summary") is True:
        sent["summary"] = True
    return sent


def opencode_boundary(
    every: list[tuple[str, dict[str, Any]]], users: list[UserMessage]
) -> Boundary | None:
    """What the session's messages (all of them: each check reads the session whole) leave
    it doing, since the first message of that state's last run; ``first``: where the turn
    before it began (the last run of working, when it ends waiting), a person's wait's end.
    A compaction's prompt is no boundary."""
    compactions = {m.id for m in users if any(_compaction_part(p) for p in m.parts)}
    runs: list[tuple[str, int | None]] = []
    for message_id, data in every:
        found = None if message_id in compactions else message_state(data)
        if found is not None and (not runs or runs[-1][0] != found[0]):
            runs.append(found)
    if not runs:
        return None
    state, at = runs[-1]
    first = runs[-2] if len(runs) > 1 and runs[-2][0] == WORKING else runs[-1]
    return Boundary(state, at, True, first[0], first[1])


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
    if not db or not os.path.lexists(db):
        return catalog
    real = os.path.realpath(db)
    why = unopenable(real)
    if why is not None:  # a FIFO, a folder, a link in a loop, a file of mode 000
        catalog.errors.append({"path": shown_path(real), "reason": why})
        return catalog

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
