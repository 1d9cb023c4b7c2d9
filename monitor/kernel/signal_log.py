"""The signal log: recording typed state events and reading them back.

:func:`record_event` is the whole recording transaction (insert or find the duplicate, raise
the head, move the target's cursors) as one synchronous function the store runs in a single
``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import re
import sqlite3

import orjson

from monitor.clock import DAY_MS, HOUR_MS
from monitor.errors import StoreError
from monitor.kernel import outbox
from monitor.kernel.cursors import advance_watchers, register_watch, seed_cursor
from monitor.kernel.drafts import EventDraft, Recorded
from monitor.kernel.events import (
    DELTA_PAYLOAD_FIELDS,
    NOTIFYING_KINDS,
    EventKind,
    StateEvent,
    json_object,
)
from monitor.kernel.keys import parse_agent_key
from monitor.kernel.notices import PROVENANCE_AMBIENT, Notice
from monitor.kernel.policy import NO_ROUTE, EventRoute
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from monitor.kernel.store.protocol import Conn

CHANGES_LIMIT = 200

_EVENT_COLUMNS = (
    "sequence, session_key, agent_id, kind, actor_type, actor_id, session_id, run_id,"
    " occurred_at, summary, payload_json, dedupe_key"
)


def _row_to_event(row: tuple[Any, ...]) -> StateEvent:
    (
        seq,
        key,
        agent,
        kind,
        actor_type,
        actor_id,
        sid,
        run,
        occurred,
        summary,
        payload_json,
        dedupe,
    ) = row
    return StateEvent(
        sequence=seq,
        session_key=key,
        agent_id=agent,
        kind=kind,
        actor_type=actor_type,
        actor_id=actor_id,
        session_id=sid,
        run_id=run,
        occurred_at=occurred,
        summary=summary,
        payload=json_object(payload_json),
        dedupe_key=dedupe,
    )


def find_by_dedupe(conn: Conn, dedupe_key: str) -> StateEvent | None:
    row = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM session_state_events WHERE dedupe_key = ?",
        (dedupe_key,),
    ).fetchone()
    return _row_to_event(row) if row else None


def newest_dedupe_key(conn: Conn, key: str, agent_id: str, kind: str, prefix: str) -> str | None:
    """The dedupe key of the session's newest ``kind`` event whose key starts with
    ``prefix`` (the session's index, newest first)."""
    row = conn.execute(
        "SELECT dedupe_key FROM session_state_events WHERE session_key = ? AND agent_id = ?"
        " AND kind = ? AND substr(dedupe_key, 1, ?) = ? ORDER BY sequence DESC LIMIT 1",
        (key, agent_id, kind, len(prefix), prefix),
    ).fetchone()
    return str(row[0]) if row else None


def raise_head(conn: Conn, key: str, agent_id: str, sequence: int, now: int) -> None:
    conn.execute(
        "INSERT INTO session_state_heads (session_key, agent_id, last_sequence,"
        " pruned_max_sequence, updated_at) VALUES (?, ?, ?, 0, ?)"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " last_sequence = CASE WHEN excluded.last_sequence > session_state_heads.last_sequence"
        " THEN excluded.last_sequence ELSE session_state_heads.last_sequence END,"
        " updated_at = excluded.updated_at",
        (key, agent_id, sequence, now),
    )


_INSERT_EVENT = (
    "INSERT INTO session_state_events (dedupe_key, session_key, session_id, agent_id,"
    " kind, actor_type, actor_id, run_id, occurred_at, summary, payload_json)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(dedupe_key) DO NOTHING"
)


def record_event(conn: Conn, draft: EventDraft, now: int, route: EventRoute = NO_ROUTE) -> Recorded:
    """The recording transaction's body, acting on the policy's ``route``: see the module
    docstring."""
    row = draft.row
    payload_json = orjson.dumps(row.payload).decode() if row.payload else None
    values = (
        row.dedupe_key,
        row.session_key,
        row.session_id,
        row.agent_id,
        row.kind,
        row.actor_type,
        row.actor_id,
        row.run_id,
        row.occurred_at,
        row.summary,
        payload_json,
    )
    sequence: int | None  # None: the dedupe key is taken
    if isinstance(conn, sqlite3.Connection):  # a RETURNING costs SQLite 9 µs (3.40)
        cursor = conn.execute(_INSERT_EVENT, values)
        sequence = cursor.lastrowid if cursor.rowcount == 1 else None
    else:
        returned = conn.execute(_INSERT_EVENT + " RETURNING sequence", values).fetchone()
        sequence = None if returned is None else int(returned[0])
    if sequence is None:
        assert row.dedupe_key is not None  # only a dedupe key can conflict
        existing = find_by_dedupe(conn, row.dedupe_key)
        if existing is None:  # pragma: no cover - the conflict row cannot vanish mid-transaction
            raise StoreError(f"dedupe key {row.dedupe_key} conflicted but is not stored")
        return Recorded(event=existing, duplicate=True)
    raise_head(conn, row.session_key, row.agent_id, sequence, now)
    notices: list[Notice] = []
    if route.seed and route.store_path:
        seed_cursor(
            conn,
            watcher=route.seed,
            target=row.session_key,
            store_path=route.store_path,
            at=sequence,
            now=now,
        )
    elif row.kind in NOTIFYING_KINDS and row.session_key.startswith("agent:"):
        notices = advance_watchers(
            conn,
            target=row.session_key,
            sequence=sequence,
            actor_id=row.actor_id,
            now=now,
        )
        outbox.append(conn, notices, now)
    if route.ambient and route.store_path:
        register_watch(
            conn,
            watcher=route.ambient,
            target=row.session_key,
            store_path=route.store_path,
            provenance=PROVENANCE_AMBIENT,
            now=now,
            head_of=lambda key, agent: read_head(conn, key, agent)[0],
        )
    event = row._replace(sequence=sequence)
    return Recorded(event=event, duplicate=False, notices=tuple(notices))


def state_changes(
    conn: Conn, key: str, agent_id: str, since: int, limit: int = CHANGES_LIMIT
) -> tuple[list[StateEvent], bool]:
    """Events of one session after ``since``, ascending, at most ``limit``; and whether
    more exist."""
    rows = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM session_state_events"
        " WHERE session_key = ? AND agent_id = ? AND sequence > ?"
        " ORDER BY sequence ASC LIMIT ?",
        (key, agent_id, since, limit + 1),
    ).fetchall()
    return [_row_to_event(r) for r in rows[:limit]], len(rows) > limit


def earliest_sequence(conn: Conn, key: str, agent_id: str) -> int | None:
    row = conn.execute(
        "SELECT min(sequence) FROM session_state_events WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def read_head(conn: Conn, key: str, agent_id: str) -> tuple[int, int]:
    """``(last_sequence, pruned_max_sequence)`` of a session, zeros when never logged."""
    row = conn.execute(
        "SELECT last_sequence, pruned_max_sequence FROM session_state_heads"
        " WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def prune_events(conn: Conn, *, before: int, cap: int, now: int) -> tuple[int, int]:
    """Retention: events older than ``before`` or at most ``cap`` go; each pruned session's
    head keeps its last sequence and records the newest pruned one (for ``historyGap``).
    How many heads were stamped, and how many events went."""
    doomed = "(occurred_at < :cutoff OR sequence <= :cap)"
    params = {"cutoff": before, "cap": cap, "now": now}
    stamped = conn.execute(
        "INSERT INTO session_state_heads (session_key, agent_id, last_sequence,"
        " pruned_max_sequence, updated_at)"
        f" SELECT session_key, agent_id, max(sequence), max(sequence), CAST(:now AS BIGINT)"
        f" FROM session_state_events WHERE {doomed} GROUP BY session_key, agent_id"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " last_sequence = CASE WHEN excluded.last_sequence > session_state_heads.last_sequence"
        " THEN excluded.last_sequence ELSE session_state_heads.last_sequence END,"
        " pruned_max_sequence = CASE"
        " WHEN excluded.pruned_max_sequence > session_state_heads.pruned_max_sequence"
        " THEN excluded.pruned_max_sequence ELSE session_state_heads.pruned_max_sequence END",
        params,
    ).rowcount
    deleted = conn.execute(f"DELETE FROM session_state_events WHERE {doomed}", params).rowcount
    return stamped, deleted


def state_versions(conn: Conn, keys: list[str]) -> list[StateVersion]:
    """The heads of ``keys`` (all heads when empty); a key without a head is answered with
    version 0 and the agent its key names, if any."""
    sql = "SELECT session_key, agent_id, last_sequence FROM session_state_heads"
    if not keys:
        return [StateVersion(*r) for r in conn.execute(sql + " ORDER BY session_key, agent_id")]
    out: list[StateVersion] = []
    for k in keys:
        rows = conn.execute(sql + " WHERE session_key = ? ORDER BY agent_id", (k,)).fetchall()
        if not rows:
            parsed = parse_agent_key(k)
            out.append(StateVersion(k, parsed.agent_id if parsed else None, 0))
        out += [StateVersion(*r) for r in rows]
    return out


def delete_session_log(conn: Conn, scope: str, params: tuple[str, ...]) -> None:
    """Remove the events and head of a ``keys.session_scope``."""
    conn.execute(f"DELETE FROM session_state_events WHERE {scope}", params)
    conn.execute(f"DELETE FROM session_state_heads WHERE {scope}", params)


def row_cap_sequence(conn: Conn, max_rows: int) -> int:
    """Rows with a sequence at or below this fall outside the newest ``max_rows``."""
    row = conn.execute(
        "SELECT sequence FROM session_state_events ORDER BY sequence DESC LIMIT 1 OFFSET ?",
        (max_rows,),
    ).fetchone()
    return int(row[0]) if row else 0


class ChangesSince(NamedTuple):
    """The events after a sequence a caller has seen (``truncated`` past the page), the
    earliest sequence still kept, and whether retention pruned events the caller has not
    seen (``history_gap``)."""

    events: list[StateEvent]
    truncated: bool
    earliest_available_sequence: int
    history_gap: bool


class SessionStatus(NamedTuple):
    """The ``session_status`` of one session: its state version always, and its changes
    when asked for them."""

    session_key: str
    state_version: int
    state_changes: ChangesSince | None


class StateVersion(NamedTuple):
    session_key: str
    agent_id: str | None  # None for a key with no agent and no head
    state_version: int


def session_status(conn: Conn, key: str, agent_id: str, changes_since: int | None) -> SessionStatus:
    """A session's state version; with ``changes_since``, its changes after it."""
    version, pruned = read_head(conn, key, agent_id)
    if changes_since is None:
        return SessionStatus(key, version, None)
    events, truncated = state_changes(conn, key, agent_id, changes_since)
    earliest = earliest_sequence(conn, key, agent_id) or (version + 1 if version else 0)
    changes = ChangesSince(events, truncated, earliest, changes_since < pruned)
    return SessionStatus(key, version, changes)


def status_answer(conn: Conn, key: str, agent_id: str, since: int) -> bytes:
    """``session_status`` with ``changesSince``, as the API answers it (the JSON of
    :func:`status_object`): the database builds the events' JSON in the one statement that
    also reads the head, the earliest sequence and whether more follow, so no Python object
    is made per event. PostgreSQL 15 cannot check that a text is JSON without failing on
    it, so where its statement meets a payload that is not JSON, the answer is made in
    Python from the rows (in a transaction of its own: on PostgreSQL it runs as a
    single-statement peek, outside one), as :func:`status_object` makes it.
    SQLite checks each payload (``json_valid``)."""
    if isinstance(conn, sqlite3.Connection):
        row = conn.execute(_STATUS_SQLITE, (key, agent_id, since, CHANGES_LIMIT)).fetchone()
    else:
        params = {"key": key, "agent": agent_id, "since": since, "limit": CHANGES_LIMIT}
        try:
            row = conn.execute(_STATUS_PG, params).fetchone()
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "22P02":  # invalid_text_representation
                raise
            # one snapshot of its own: a single-statement peek runs outside a transaction
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            found = session_status(conn, key, agent_id, since)
            conn.execute("COMMIT")
            return orjson.dumps(status_object(found))
    version, pruned, earliest, events, more = row
    version, pruned = version or 0, pruned or 0
    if earliest is None:
        earliest = version + 1 if version else 0
    changes = _changes(orjson.Fragment(events or "[]"), bool(more), earliest, since < pruned)
    return orjson.dumps(_status(key, version, changes))


def delta_object(event: StateEvent) -> dict[str, Any]:
    """An event of a ``stateChanges`` answer: absent fields are left out, and the payload is
    projected to the fields OpenClaw's ``session_status`` shows."""
    out: dict[str, Any] = {
        "sequence": event.sequence,
        "kind": event.kind,
        "actorType": event.actor_type,
    }
    if event.actor_id is not None:
        out["actorId"] = event.actor_id
    if event.run_id is not None:
        out["runId"] = event.run_id
    out["summary"] = event.summary
    out["occurredAt"] = event.occurred_at
    payload = {k: event.payload[k] for k in DELTA_PAYLOAD_FIELDS if k in event.payload}
    if payload:
        out["payload"] = payload
    return out


def status_object(found: SessionStatus) -> dict[str, Any]:
    """The ``session_status`` object: ``stateVersion`` always, ``stateChanges`` on ask."""
    changes = found.state_changes
    if changes is None:
        return _status(found.session_key, found.state_version, None)
    events = [delta_object(e) for e in changes.events]
    return _status(
        found.session_key,
        found.state_version,
        _changes(
            events, changes.truncated, changes.earliest_available_sequence, changes.history_gap
        ),
    )


def _status(key: str, version: int, changes: dict[str, Any] | None) -> dict[str, Any]:
    """The answer's keys, spelled once for the statement's answer and for Python's."""
    out: dict[str, Any] = {"ok": True, "sessionKey": key, "stateVersion": version}
    if changes is not None:
        out["stateChanges"] = changes
    return out


def _changes(events: Any, truncated: bool, earliest: int, gap: bool) -> dict[str, Any]:
    return {
        "events": events,
        "truncated": truncated,
        "earliestAvailableSequence": earliest,
        "historyGap": gap,
    }


# One event of a stateChanges answer, as text: absent fields left out, the payload projected
# to DELTA_PAYLOAD_FIELDS (a field held as JSON null stays null, as the projection in Python
# keeps it; a payload that is not a JSON object counts as empty). The fields every event
# has go through json_object, one of four (with or without an actor, with or without a
# run): a call per row costs SQLite a quarter less than concatenating each field with
# json_quote. occurredAt (an integer) is its last member, so the one brace rtrim takes off
# is the object's own, and the payload goes in before it is put back.
#
# A payload that holds no field but those (nothing is left once they are removed), as nearly
# every payload this sidecar and the gateway write does (an adoption's names its catalog and
# host), goes in as it is stored: it is valid JSON (json_valid), and an object without a
# colon is empty, and left out. Only another payload is built a field at a time, which cost
# SQLite about 0.85 µs a row: 40% of a page of 200 events.
_PROJECTED_SQLITE = (
    "coalesce(',\"payload\":{' || nullif(substr("
    + " || ".join(
        f"coalesce(',\"{f}\":' || (payload_json -> '$.{f}'), '')" for f in DELTA_PAYLOAD_FIELDS
    )
    + ", 2), '') || '}', '')"
)
_PAYLOAD_SQLITE = (
    "CASE WHEN json_valid(payload_json) THEN CASE WHEN json_remove(payload_json, "
    + ", ".join(f"'$.{f}'" for f in DELTA_PAYLOAD_FIELDS)
    + ") = '{}' THEN CASE WHEN instr(payload_json, ':') THEN ',\"payload\":' || payload_json"
    " ELSE '' END ELSE " + _PROJECTED_SQLITE + " END ELSE '' END"
)


def _delta_object_sqlite(actor: bool, run: bool) -> str:
    """The json_object of an event's fixed fields, with its actor and its run or without."""
    members = ["'sequence', sequence", "'kind', kind", "'actorType', actor_type"]
    members += ["'actorId', actor_id"] if actor else []
    members += ["'runId', run_id"] if run else []
    members += ["'summary', summary", "'occurredAt', occurred_at"]
    return "json_object(" + ", ".join(members) + ")"


_DELTA_SQLITE = (
    "rtrim(CASE WHEN actor_id IS NULL THEN CASE WHEN run_id IS NULL"
    f" THEN {_delta_object_sqlite(False, False)} ELSE {_delta_object_sqlite(False, True)} END"
    " ELSE CASE WHEN run_id IS NULL"
    f" THEN {_delta_object_sqlite(True, False)} ELSE {_delta_object_sqlite(True, True)} END"
    " END, '}') || " + _PAYLOAD_SQLITE + " || '}'"
)


def _numbered(sql: str, names: tuple[str, ...]) -> str:
    """``sql`` with each ``:name`` as ``?N``, N its place in ``names`` (a name not there
    fails the import): bound from a tuple, a statement costs sqlite3 a dictionary lookup
    less per name (0.8 of 25 µs here)."""
    return re.sub(r":(\w+)", lambda m: f"?{names.index(m.group(1)) + 1}", sql)


# Whether more follow is looked up only after a full page (a page that is not full ends
# the session's events: 10% of a 10-event answer), and then from the page's last event on:
# one step of the index where counting the page's rows again took 200 (5% to 10% of a
# 200-event answer). Bound as (key, agent, since, limit).
_STATUS_SQLITE = (
    "WITH page AS (SELECT sequence, " + _DELTA_SQLITE + " AS delta FROM session_state_events"
    " WHERE session_key = :key AND agent_id = :agent AND sequence > :since"
    " ORDER BY sequence LIMIT :limit)"
    " SELECT h.last_sequence, h.pruned_max_sequence,"
    " (SELECT min(sequence) FROM session_state_events"
    " WHERE session_key = :key AND agent_id = :agent),"
    " g.events,"
    " CASE WHEN g.n < :limit THEN 0 ELSE EXISTS (SELECT 1 FROM session_state_events"
    " WHERE session_key = :key AND agent_id = :agent AND sequence > g.last) END"
    " FROM (SELECT '[' || group_concat(delta, ',') || ']' AS events, count(*) AS n,"
    " max(sequence) AS last FROM page) AS g LEFT JOIN session_state_heads h"
    " ON h.session_key = :key AND h.agent_id = :agent"
)
_STATUS_SQLITE = _numbered(_STATUS_SQLITE, ("key", "agent", "since", "limit"))
_PAYLOAD_PG = (
    "(SELECT json_object_agg(f.key, f.value) FROM json_each(CASE"
    " WHEN json_typeof(CAST(payload_json AS json)) = 'object'"
    " THEN CAST(payload_json AS json) END) f WHERE f.key IN ("
    + ", ".join(f"'{f}'" for f in DELTA_PAYLOAD_FIELDS)
    + "))"
)
_STATUS_PG = (
    "WITH page AS (SELECT sequence, CAST(json_strip_nulls(json_build_object("
    "'sequence', sequence, 'kind', kind, 'actorType', actor_type, 'actorId', actor_id,"
    " 'runId', run_id, 'summary', summary, 'occurredAt', occurred_at)) AS jsonb) AS delta, "
    + _PAYLOAD_PG
    + " AS payload FROM session_state_events"
    " WHERE session_key = :key AND agent_id = :agent AND sequence > :since"
    " ORDER BY sequence LIMIT :limit)"
    " SELECT h.last_sequence, h.pruned_max_sequence,"
    " (SELECT min(sequence) FROM session_state_events"
    " WHERE session_key = :key AND agent_id = :agent),"
    " (SELECT CAST(json_agg(CASE WHEN payload IS NULL THEN delta"
    " ELSE delta || jsonb_build_object('payload', payload) END ORDER BY sequence) AS text)"
    " FROM page),"
    " EXISTS (SELECT 1 FROM session_state_events"  # after the page's last (none: NULL)
    " WHERE session_key = :key AND agent_id = :agent"
    " AND sequence > (SELECT max(sequence) FROM page))"
    " FROM (SELECT 1) AS one LEFT JOIN session_state_heads h"
    " ON h.session_key = :key AND h.agent_id = :agent"
)


# -- what a person reads at a glance (the status page) ---------------------------------------


class Activity(NamedTuple):  # a NamedTuple: a dataclass costs every one-shot command's start
    """What people typed into one session: when last, and the turns of the last hour and
    day (a tick's turns are one event that says how many)."""

    last_at: int
    last_hour: int = 0
    last_day: int = 0
    hours: tuple[int, ...] = ()  # the turns of each of the last 24 hours, oldest first


def human_activity(conn: Conn, now: int) -> dict[str, Activity]:
    """Per session key with any direct human turn logged."""
    kind = EventKind.HUMAN_DIRECT_MESSAGE.value
    last = conn.execute(
        "SELECT session_key, max(occurred_at) FROM session_state_events"
        " WHERE kind = ? GROUP BY session_key",
        (kind,),
    ).fetchall()
    hour: dict[str, int] = {}
    day: dict[str, int] = {}
    hours: dict[str, list[int]] = {}
    rows = conn.execute(
        "SELECT session_key, occurred_at, payload_json FROM session_state_events"
        " WHERE kind = ? AND occurred_at >= ?",
        (kind, now - DAY_MS),
    ).fetchall()
    for key, at, payload_json in rows:
        turns = json_object(payload_json).get("turns", 1)
        n = turns if isinstance(turns, int) and turns > 0 else 1
        day[key] = day.get(key, 0) + n
        if at >= now - HOUR_MS:
            hour[key] = hour.get(key, 0) + n
        slot = 23 - min(max((now - at) // HOUR_MS, 0), 23)  # a turn stamped ahead: this hour
        hours.setdefault(key, [0] * 24)[slot] += n
    return {
        key: Activity(
            last_at=int(at),
            last_hour=hour.get(key, 0),
            last_day=day.get(key, 0),
            hours=tuple(hours[key]) if key in hours else (),
        )
        for key, at in last
    }


def recent_events(conn: Conn, key: str, limit: int) -> list[StateEvent]:
    """The newest ``limit`` events of one session key (every agent), newest first."""
    rows = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM session_state_events WHERE session_key = ?"
        " ORDER BY sequence DESC LIMIT ?",
        (key, limit),
    ).fetchall()
    return [_row_to_event(r) for r in rows]


def last_sequence(conn: Conn) -> int:
    row = conn.execute("SELECT max(sequence) FROM session_state_events").fetchone()
    return int(row[0]) if row and row[0] is not None else 0
