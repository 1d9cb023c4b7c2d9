"""The owner of ``session_upstream_links``, ``sessionwatch_link_state``,
``sessionwatch_source_follows`` and ``sessionwatch_doing_history``: all their SQL.

A link ties a session key (and its agent) to a native source with a marker. Adopting the same
source again keeps the marker; a different source rebases it and clears ``last_scanned_at``.
The link state is what the monitor keeps of a link between ticks (missing streak, blocked
offset, the last outcome worth showing and its reason). A follow is the sidecar's own marker
in a thread beside the one the gateway probes (a Codex source after the gateway's branch):
the gateway's link and marker are never moved for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from adapters.base import Drift, Followed, Marker
from adapters.registry import LOCAL_HOST, adapter_for_link, entry, host_id_for
from adapters.states import QUIET, UNKNOWN, WORKING, Doing
from monitor.kernel.events import json_object

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

_LINK_COLUMNS = (
    "session_key, agent_id, catalog_id, host_id, thread_id, upstream_kind, upstream_ref_json,"
    " last_marker_json, last_scanned_at, created_at, updated_at"
)


class UpstreamLink(NamedTuple):
    """A link row. ``upstream_kind`` is the stored (OpenClaw) kind; ``kind`` is the adapter
    of ours that reads it, or None for a kind we do not read (a foreign link). A NamedTuple:
    a tick builds one per watched link, and a frozen dataclass cost it twice the time."""

    session_key: str
    agent_id: str
    catalog_id: str | None
    host_id: str | None
    thread_id: str | None
    upstream_kind: str
    kind: str | None
    ref: dict[str, Any]
    marker: Marker
    last_scanned_at: int | None
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> UpstreamLink:
        key, agent, catalog, host, thread, kind, ref_json, marker_json, scanned, made, at = row
        ref = json_object(ref_json)
        ours = adapter_for_link(kind, host, ref)
        marker = json_object(marker_json)
        return cls(key, agent, catalog, host, thread, kind, ours, ref, marker, scanned, made, at)

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_key, self.agent_id)

    @property
    def foreign(self) -> bool:
        """A kind we do not read: left untouched, never ticked, never deleted by us."""
        return self.kind is None

    @property
    def source_key(self) -> str:
        """16 hex digits naming the source (host, thread, ref), computed as OpenClaw does, so
        the dedupe keys of a turn are the same whichever side records it."""
        return source_key(self.host_id, self.thread_id, self.ref)


def source_key(host_id: str | None, thread_id: str | None, ref: dict[str, Any]) -> str:
    """:attr:`UpstreamLink.source_key` of a link's columns."""
    raw = f"{host_id or ''}\0{thread_id or ''}\0{orjson.dumps(ref).decode()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


_PRIVATE_MARKER_FIELDS = frozenset({"pending", "head", "tail", "echo", "recent", "drift", "ino"})


def public_marker(marker: Marker) -> Marker:
    """The marker as shown to people: bookkeeping hashes are left out."""
    return {k: v for k, v in marker.items() if k not in _PRIVATE_MARKER_FIELDS}


def read_link(conn: Conn, key: str, agent_id: str) -> UpstreamLink | None:
    row = conn.execute(
        f"SELECT {_LINK_COLUMNS} FROM session_upstream_links"
        " WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    return UpstreamLink.from_row(row) if row else None


def keys_linked_to(conn: Conn, ref: dict[str, Any]) -> list[str]:
    """The session keys whose link follows ``ref`` (compared as upsert_link writes it)."""
    ref_json = orjson.dumps(ref, option=orjson.OPT_SORT_KEYS).decode()
    rows = conn.execute(
        "SELECT session_key FROM session_upstream_links WHERE upstream_ref_json = ?",
        (ref_json,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def upsert_link(
    conn: Conn,
    *,
    key: str,
    agent_id: str,
    kind: str,
    ref: dict[str, Any],
    marker: Marker,
    thread_id: str,
    now: int,
    host: str = LOCAL_HOST,
) -> UpstreamLink:
    """Create the link, keep the marker of the same source, rebase a different one.

    The row is written in OpenClaw's vocabulary (see :mod:`adapters.registry`); "the same
    source" means what OpenClaw's own upsert compares: host, thread, kind and ref.
    """
    vocab = entry(kind)
    conn.execute(
        f"INSERT INTO session_upstream_links ({_LINK_COLUMNS})"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET catalog_id = excluded.catalog_id,"
        " host_id = excluded.host_id, thread_id = excluded.thread_id,"
        " upstream_kind = excluded.upstream_kind,"
        " upstream_ref_json = excluded.upstream_ref_json,"
        " last_marker_json = CASE WHEN " + _SOURCE_CHANGED + " THEN excluded.last_marker_json"
        " ELSE session_upstream_links.last_marker_json END,"
        " last_scanned_at = CASE WHEN " + _SOURCE_CHANGED + " THEN NULL"
        " ELSE session_upstream_links.last_scanned_at END,"
        " updated_at = excluded.updated_at",
        (
            key,
            agent_id,
            vocab.catalog_id,
            host_id_for(kind, ref, host),
            thread_id,
            vocab.upstream_kind,
            orjson.dumps(ref, option=orjson.OPT_SORT_KEYS).decode(),
            orjson.dumps(marker).decode(),
            now,
            now,
        ),
    )
    link = read_link(conn, key, agent_id)
    assert link is not None
    return link


_SOURCE_CHANGED = (
    "(session_upstream_links.thread_id IS DISTINCT FROM excluded.thread_id"
    " OR session_upstream_links.host_id IS DISTINCT FROM excluded.host_id"
    " OR session_upstream_links.upstream_kind IS DISTINCT FROM excluded.upstream_kind"
    " OR session_upstream_links.upstream_ref_json IS DISTINCT FROM excluded.upstream_ref_json)"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkState:
    """What the monitor keeps of a link between ticks. It starts afresh when the link, or
    the gateway session's id, changed; what the session is doing (``doing``) only when its
    source did: a marker another checker moved reads on from where it left it."""

    streak: int = 0
    blocked_offset: int | None = None
    outcome: str | None = None  # the last outcome that was not a plain quiet check
    reason: str | None = None
    doing: Doing = field(default_factory=Doing)


def link_state(conn: Conn, link: UpstreamLink, session_id: str | None) -> LinkState:
    row = conn.execute(
        "SELECT source_key, link_updated_at, session_id, missing_streak, blocked_offset,"
        " last_outcome, last_reason, doing, doing_since, doing_source"
        " FROM sessionwatch_link_state WHERE session_key = ? AND agent_id = ?",
        (link.session_key, link.agent_id),
    ).fetchone()
    if row is None:
        return LinkState()
    key = link.source_key
    doing = _doing(row[7:], key)
    if row[0] != key or row[1] != link.updated_at:
        return LinkState(doing=doing)
    streak = int(row[3]) if row[2] == session_id else 0
    return LinkState(
        streak=streak, blocked_offset=row[4], outcome=row[5], reason=row[6], doing=doing
    )


def _doing(columns: tuple[Any, ...], source_key: str) -> Doing:
    """What the session is doing, as kept, if it was read from the source ``source_key``."""
    state, since, source = columns[:3]
    if state is None or source != source_key:
        return Doing()
    return Doing(str(state), since if isinstance(since, int) else None)


def write_link_state(
    conn: Conn,
    link: UpstreamLink,
    session_id: str | None,
    state: LinkState,
    blocked_reason: str | None = None,
    seen_at: int | None = None,
) -> None:
    """The link's state; what the session is doing (``state.doing``) and when a record
    was last read (``seen_at``) only from a check that read records (else kept)."""
    doing = (state.doing.state, state.doing.since, link.source_key, seen_at)
    conn.execute(
        "INSERT INTO sessionwatch_link_state (session_key, agent_id, source_key,"
        " link_updated_at, session_id, missing_streak, blocked_offset, blocked_reason,"
        " last_outcome, last_reason, doing, doing_since, doing_source, doing_seen_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " source_key = excluded.source_key, link_updated_at = excluded.link_updated_at,"
        " session_id = excluded.session_id, missing_streak = excluded.missing_streak,"
        " blocked_offset = excluded.blocked_offset, blocked_reason = excluded.blocked_reason,"
        " last_outcome = excluded.last_outcome, last_reason = excluded.last_reason"
        + "".join(f", {c} = {_KEPT.format(c=c)}" for c in _DOING),
        (
            link.session_key,
            link.agent_id,
            link.source_key,
            link.updated_at,
            session_id,
            state.streak,
            state.blocked_offset,
            blocked_reason,
            state.outcome,
            state.reason,
            *(doing if seen_at is not None else (None,) * len(doing)),
        ),
    )


_DOING = ("doing", "doing_since", "doing_source", "doing_seen_at")
_KEPT = (  # a check that read no records keeps what the session was doing
    "CASE WHEN excluded.doing_seen_at IS NULL THEN sessionwatch_link_state.{c}"
    " ELSE excluded.{c} END"
)


def note_link_status(conn: Conn, link: UpstreamLink, outcome: str, reason: str | None) -> None:
    """Record why a link was not checked, for ``links``; its streak stays as it was."""
    conn.execute(
        "INSERT INTO sessionwatch_link_state (session_key, agent_id, source_key,"
        " link_updated_at, last_outcome, last_reason) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " missing_streak = CASE WHEN sessionwatch_link_state.source_key = excluded.source_key"
        " AND sessionwatch_link_state.link_updated_at = excluded.link_updated_at"
        " THEN sessionwatch_link_state.missing_streak ELSE 0 END,"
        " source_key = excluded.source_key, link_updated_at = excluded.link_updated_at,"
        " last_outcome = excluded.last_outcome, last_reason = excluded.last_reason",
        (link.session_key, link.agent_id, link.source_key, link.updated_at, outcome, reason),
    )


def note_skips(conn: Conn, skipped: list[tuple[UpstreamLink, str]]) -> None:
    """Why watched links were not checked (a run active, no session id, ambiguous)."""
    for link, reason in skipped:
        note_link_status(conn, link, "skipped", reason)


class Blocked(NamedTuple):
    offset: int
    reason: str | None


class LastCheck(NamedTuple):
    outcome: str
    reason: str | None


class LinkView(NamedTuple):
    """A link with its state, as ``sessionwatch links`` and the API show it: the marker
    without its private parts, the state only when it is of this link's current source."""

    link: UpstreamLink
    marker: Marker  # public_marker(link.marker)
    watched: bool
    blocked: Blocked | None
    missing_streak: int
    status: LastCheck | None
    drift: Drift
    doing: Doing = Doing()  # what the session is doing, as it reads now (quiet derived)


class Now(NamedTuple):
    """When a listing is read (ms, the store's clock), and how long a turn may go without
    a record before it reads as quiet (ms)."""

    at: int
    quiet_after: int


def list_links(conn: Conn, targets: set[str], now: Now) -> list[LinkView]:
    """Every link with its state; ``watched`` when its session is among ``targets``."""
    rows = conn.execute(
        f"SELECT {', '.join('l.' + c.strip() for c in _LINK_COLUMNS.split(','))},"
        " s.source_key, s.link_updated_at, s.missing_streak, s.blocked_offset,"
        " s.blocked_reason, s.last_outcome, s.last_reason,"
        " s.doing, s.doing_since, s.doing_source, s.doing_seen_at"
        " FROM session_upstream_links l LEFT JOIN sessionwatch_link_state s"
        " ON s.session_key = l.session_key AND s.agent_id = l.agent_id"
        " ORDER BY l.session_key, l.agent_id"
    ).fetchall()
    return [
        _listed(UpstreamLink.from_row(row[:11]), row[11:], row[0] in targets, now) for row in rows
    ]


def _listed(link: UpstreamLink, state: tuple[Any, ...], watched: bool, now: Now) -> LinkView:
    source, updated, streak, blocked_at, blocked_reason, outcome, reason = state[:7]
    key = link.source_key if source is not None else ""  # no state kept: none of this
    current = source == key and updated == link.updated_at
    doing = doing_now(_doing(state[7:], key), state[10], now.at, now.quiet_after)
    return LinkView(
        link=link,
        marker=public_marker(link.marker),
        watched=bool(watched),
        blocked=Blocked(blocked_at, blocked_reason) if current and blocked_at is not None else None,
        missing_streak=int(streak) if current and streak else 0,
        status=LastCheck(outcome, reason) if current and outcome else None,
        drift=Drift.from_json(link.marker.get("drift")),
        doing=doing,
    )


class SessionDoing(NamedTuple):
    """What an adopted session is doing (adapters.states), as ``links``, ``GET /v1/sessions
    ?state=`` and the page show it: ``quiet`` is ``working`` with no record read for
    ``quiet_after`` ms, since that last record."""

    session_key: str
    agent_id: str
    upstream_kind: str
    state: str
    since: int | None


def doing_now(doing: Doing, seen_at: int | None, now: int, quiet_after: int) -> Doing:
    """``doing`` as it reads at ``now``: quiet when a turn is in progress and no record was
    read for ``quiet_after`` ms (derived here, never written: no timer)."""
    if doing.state == WORKING and seen_at is not None and now - seen_at >= quiet_after:
        return Doing(QUIET, seen_at)
    return doing


def sessions_doing(conn: Conn, states: frozenset[str], now: Now) -> list[SessionDoing]:
    """The adopted sessions doing one of ``states`` now (all, when empty), the longest
    first (the earliest ``since``)."""
    stored = {WORKING if s == QUIET else s for s in states}
    every = not stored or UNKNOWN in stored  # unknown: no row, or one not of this source
    where = "" if every else f" WHERE s.doing IN ({', '.join('?' * len(stored))})"
    rows = conn.execute(
        "SELECT l.session_key, l.agent_id, l.upstream_kind, l.host_id, l.thread_id,"
        " l.upstream_ref_json, s.doing, s.doing_since, s.doing_source, s.doing_seen_at"
        " FROM session_upstream_links l LEFT JOIN sessionwatch_link_state s"
        " ON s.session_key = l.session_key AND s.agent_id = l.agent_id" + where,
        () if every else tuple(stored),
    ).fetchall()
    found = []
    for key, agent, kind, host, thread, ref, state, since, source, seen in rows:
        doing = Doing()
        if state is not None:  # else no key to work out
            kept = _doing((state, since, source), source_key(host, thread, json_object(ref)))
            doing = doing_now(kept, seen, now.at, now.quiet_after)
        if not states or doing.state in states:
            found.append(SessionDoing(key, agent, kind, doing.state, doing.since))
    found.sort(key=lambda d: (d.since is None, d.since or 0, d.session_key, d.agent_id))
    return found


DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def note_doing(conn: Conn, link: UpstreamLink, doing: Doing, now: int) -> None:
    """What the session is doing from ``doing.since`` on, kept for the page's chart: the
    last change before the past day and every one since (older ones go)."""
    if doing.since is None:
        return
    key = (link.session_key, link.agent_id)
    conn.execute(
        "INSERT INTO sessionwatch_doing_history (session_key, agent_id, since, state)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (session_key, agent_id, since)"
        " DO UPDATE SET state = excluded.state",
        (*key, doing.since, doing.state),
    )
    conn.execute(
        "DELETE FROM sessionwatch_doing_history WHERE session_key = ? AND agent_id = ?"
        " AND since < (SELECT max(since) FROM sessionwatch_doing_history"
        " WHERE session_key = ? AND agent_id = ? AND since <= ?)",
        (*key, *key, now - DAY_MS),
    )


def doing_hours(conn: Conn, keys: list[str], now: int) -> dict[str, tuple[str | None, ...]]:
    """For each of ``keys``, what its session was doing most of each of the last 24 hours,
    oldest first (None: nothing known), from its history."""
    if not keys:
        return {}
    rows = conn.execute(
        "SELECT session_key, since, state FROM sessionwatch_doing_history"
        f" WHERE session_key IN ({', '.join('?' * len(keys))})"
        " ORDER BY session_key, since",
        tuple(keys),
    ).fetchall()
    changes: dict[str, list[tuple[int, str]]] = {}
    for key, since, state in rows:
        changes.setdefault(str(key), []).append((int(since), str(state)))
    return {key: _hours(found, now) for key, found in changes.items()}


def _hours(changes: list[tuple[int, str]], now: int) -> tuple[str | None, ...]:
    """The state held longest in each of the 24 hours before ``now`` (oldest first)."""
    start = now - DAY_MS
    spans = [
        (max(since, start), min(until, now), state)
        for (since, state), until in zip(changes, [t for t, _ in changes[1:]] + [now], strict=True)
        if until > start and since < now
    ]
    hours: list[str | None] = []
    for hour in range(24):
        lo, hi = start + hour * HOUR_MS, start + (hour + 1) * HOUR_MS
        held: dict[str, int] = {}
        for a, b, state in spans:
            if min(b, hi) > max(a, lo):
                held[state] = held.get(state, 0) + min(b, hi) - max(a, lo)
        hours.append(max(held, key=lambda s: held[s]) if held else None)
    return tuple(hours)


def doing_versions(conn: Conn, states: frozenset[str], now: Now) -> list[tuple[SessionDoing, int]]:
    """:func:`sessions_doing`, each with its state version (0: no event yet)."""
    from monitor.kernel.signal_log import state_versions

    versions = {(v.session_key, v.agent_id): v.state_version for v in state_versions(conn, [])}
    found = sessions_doing(conn, states, now)
    return [(d, versions.get((d.session_key, d.agent_id), 0)) for d in found]


def all_links(conn: Conn) -> list[UpstreamLink]:
    rows = conn.execute(
        f"SELECT {_LINK_COLUMNS} FROM session_upstream_links ORDER BY session_key, agent_id"
    ).fetchall()
    return [UpstreamLink.from_row(r) for r in rows]


def load_links(conn: Conn, targets: set[str]) -> list[UpstreamLink]:
    """The links of the watched ``targets`` (what a tick checks)."""
    rows = conn.execute(
        f"SELECT {_LINK_COLUMNS} FROM session_upstream_links ORDER BY session_key, agent_id"
    ).fetchall()
    return [UpstreamLink.from_row(r) for r in rows if r[0] in targets]


def stateful_links(conn: Conn) -> dict[tuple[str, str], str | None]:
    """Links whose state is not plain (a streak, a block, a noted outcome): their reason."""
    return {
        (r[0], r[1]): r[2]
        for r in conn.execute(
            "SELECT session_key, agent_id, last_reason FROM sessionwatch_link_state"
            " WHERE missing_streak > 0 OR blocked_offset IS NOT NULL OR last_outcome IS NOT NULL"
        )
    }


def touch(conn: Conn, links: Iterable[UpstreamLink], now: int) -> None:
    """Stamp the scan time of quiet links (unless they changed since they were read)."""
    conn.executemany(
        "UPDATE session_upstream_links SET last_scanned_at = ? WHERE session_key = ?"
        " AND agent_id = ? AND updated_at = ?",
        [(now, x.session_key, x.agent_id, x.updated_at) for x in links],
    )


def advance_marker(conn: Conn, link: UpstreamLink, marker: Marker, now: int) -> UpstreamLink:
    """Move the link's marker, as the link now stands.

    A moved marker also moves ``updated_at``, as OpenClaw's own marker update does: the
    gateway's monitor settles a check only if ``updated_at`` is still the one it scanned
    from (it never compares markers), so a check of its that read the old marker records
    nothing once the sidecar has recorded the turn. The stamp always moves forward, even
    under a wall clock stepped back.
    """
    if marker == link.marker:
        conn.execute(
            "UPDATE session_upstream_links SET last_scanned_at = ?"
            " WHERE session_key = ? AND agent_id = ? AND updated_at = ?",
            (now, link.session_key, link.agent_id, link.updated_at),
        )
        return link
    stamp = max(now, link.updated_at + 1)
    conn.execute(
        "UPDATE session_upstream_links SET last_marker_json = ?, last_scanned_at = ?,"
        " updated_at = ? WHERE session_key = ? AND agent_id = ? AND updated_at = ?",
        (
            orjson.dumps(marker).decode(),
            now,
            stamp,
            link.session_key,
            link.agent_id,
            link.updated_at,
        ),
    )
    return link._replace(marker=marker, last_scanned_at=now, updated_at=stamp)


def load_follows(conn: Conn) -> dict[tuple[str, str], tuple[str, str, str, Marker]]:
    """Each link's follow, as kept: its source key, its thread, the thread the gateway
    probed beside it, and the marker there."""
    return {
        (r[0], r[1]): (r[2], r[3], r[4], json_object(r[5]))
        for r in conn.execute(
            "SELECT session_key, agent_id, source_key, thread_id, beside_thread_id, marker_json"
            " FROM sessionwatch_source_follows"
        )
    }


def follow_marker(conn: Conn, link: UpstreamLink, thread: str, beside: str) -> Marker | None:
    """The sidecar's marker in ``thread`` beside ``link``: None when none is kept for the
    link's current source, that thread and the branch ``beside`` (a follow of another
    source, or beside another branch, is no longer one: the gateway read the source
    between the two branches, and following begins again)."""
    row = conn.execute(
        "SELECT marker_json FROM sessionwatch_source_follows WHERE session_key = ?"
        " AND agent_id = ? AND source_key = ? AND thread_id = ? AND beside_thread_id = ?",
        (link.session_key, link.agent_id, link.source_key, thread, beside),
    ).fetchone()
    return json_object(row[0]) if row else None


def write_follow(
    conn: Conn, link: UpstreamLink, followed: Followed, marker: Marker, now: int
) -> None:
    conn.execute(
        "INSERT INTO sessionwatch_source_follows (session_key, agent_id, source_key,"
        " thread_id, beside_thread_id, marker_json, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET source_key = excluded.source_key,"
        " thread_id = excluded.thread_id, beside_thread_id = excluded.beside_thread_id,"
        " marker_json = excluded.marker_json, updated_at = excluded.updated_at",
        (
            link.session_key,
            link.agent_id,
            link.source_key,
            followed.thread,
            followed.beside,
            orjson.dumps(marker).decode(),
            now,
        ),
    )


def delete_links(conn: Conn, scope: str, params: tuple[str, ...]) -> int:
    """Remove the links (their state and follows) of a ``keys.session_scope``; how many
    links."""
    conn.execute(f"DELETE FROM sessionwatch_link_state WHERE {scope}", params)
    conn.execute(f"DELETE FROM sessionwatch_source_follows WHERE {scope}", params)
    conn.execute(f"DELETE FROM sessionwatch_doing_history WHERE {scope}", params)
    return conn.execute(f"DELETE FROM session_upstream_links WHERE {scope}", params).rowcount


def blocked_count(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM sessionwatch_link_state s JOIN session_upstream_links l"
        " ON l.session_key = s.session_key AND l.agent_id = s.agent_id"
        " WHERE s.blocked_offset IS NOT NULL AND s.link_updated_at = l.updated_at"
    ).fetchone()
    return int(row[0])


def fingerprint(conn: Conn) -> int:
    """A number that moves when any link or its state does (adopted, removed, rebased,
    advanced, blocked, missing, drifting): the status page re-renders only then. A quiet
    scan, which stamps ``last_scanned_at`` only, leaves it."""
    links = conn.execute(
        "SELECT session_key, agent_id, updated_at, last_marker_json"
        " FROM session_upstream_links ORDER BY session_key, agent_id"
    ).fetchall()
    states = conn.execute(
        "SELECT session_key, agent_id, missing_streak, blocked_offset, blocked_reason,"
        " last_outcome, last_reason FROM sessionwatch_link_state"
        " ORDER BY session_key, agent_id"
    ).fetchall()
    return hash((tuple(map(tuple, links)), tuple(map(tuple, states))))
