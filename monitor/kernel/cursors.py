"""Watch cursors: where a notice gets frozen, acknowledged and reopened.

A cursor holds ``last_seen`` (acknowledged), ``notified`` (the frozen watermark of the
pending notice) and ``material`` (the latest notifiable sequence). A notice is pending while
``material > last_seen``. All functions here run inside the caller's transaction.

Every notice a sidecar process opens (freezes, reopens or heals) is also marked in
``sessionwatch_opened_notices`` with its watermark, in the same transaction. A gateway that
shares the database opens notices of its own and delivers them from its own queue; the mark
is how a sidecar tells the two apart, so that it wakes the gateway only for its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from monitor.kernel.keys import parse_agent_key
from monitor.kernel.notices import PROVENANCE_EXPLICIT, Notice
from monitor.kernel.store.sqlite_schema import UNDECIDED_KEY, read_meta, write_meta
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

_QUALIFIED = "watcher_session_key LIKE 'agent:%:%'"
_NOTICE_COLUMNS = (
    "watcher_session_key, watcher_store_path, target_session_key,"
    " last_seen_sequence, notified_sequence, material_sequence, provenance"
)


class WatchCursor(NamedTuple):
    watcher: str
    store_path: str | None
    target: str
    last_seen: int
    notified: int
    material: int
    provenance: str

    @classmethod
    def from_row(cls, row: tuple[str, str | None, str, int, int, int, str]) -> WatchCursor:
        watcher, store_path, target, last_seen, notified, material, provenance = row
        return cls(
            watcher=watcher,
            store_path=store_path,
            target=target,
            last_seen=last_seen,
            notified=notified,
            material=material,
            provenance=provenance,
        )

    @property
    def pending(self) -> bool:
        return self.material > self.last_seen

    def notice(self) -> Notice:
        return Notice(
            watcher=self.watcher,
            store_path=self.store_path,
            target=self.target,
            last_seen=self.last_seen,
            provenance=self.provenance,
        )


def read_cursor(conn: Conn, watcher: str, target: str) -> WatchCursor | None:
    row = conn.execute(
        f"SELECT {_NOTICE_COLUMNS} FROM session_watch_cursors"
        " WHERE watcher_session_key = ? AND target_session_key = ?",
        (watcher, target),
    ).fetchone()
    return WatchCursor.from_row(row) if row else None


def refrozen_after(conn: Conn, watcher: str, target: str, last_seen: int, after: int) -> bool:
    """Whether the pair's notice (pending since ``last_seen``) was frozen again after
    ``after`` (ms) by another writer: its watermark moved up to its material work with
    nothing else changed. OpenClaw's gateway does that at its start, for every pending
    notice whose watcher exists, and queues and wakes each itself
    (``sweepSessionStateWatchNotices``). This sidecar never leaves that mark: its own writes
    to a pending cursor raise the material work past the watermark, open a new notice, or
    (a spawn edge, a promotion to explicit) leave ``updated_at`` as it was."""
    row = conn.execute(
        "SELECT 1 FROM session_watch_cursors WHERE watcher_session_key = ?"
        " AND target_session_key = ? AND last_seen_sequence = ?"
        " AND notified_sequence = material_sequence AND material_sequence > last_seen_sequence"
        " AND updated_at > ?",
        (watcher, target, last_seen, after),
    ).fetchone()
    return row is not None


def _write_fresh(
    conn: Conn,
    *,
    watcher: str,
    target: str,
    store_path: str,
    at: int,
    provenance: str,
    now: int,
) -> None:
    conn.execute(
        "INSERT INTO session_watch_cursors (watcher_session_key, watcher_store_path,"
        " target_session_key, last_seen_sequence, notified_sequence, material_sequence,"
        " provenance, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(watcher_session_key, target_session_key) DO UPDATE SET"
        " watcher_store_path = excluded.watcher_store_path,"
        " last_seen_sequence = excluded.last_seen_sequence,"
        " notified_sequence = excluded.notified_sequence,"
        " material_sequence = excluded.material_sequence,"
        " provenance = excluded.provenance, updated_at = excluded.updated_at",
        (watcher, store_path, target, at, at, at, provenance, now),
    )


def register_watch(
    conn: Conn,
    *,
    watcher: str,
    target: str,
    store_path: str,
    provenance: str,
    now: int,
    head_of: Callable[[str, str], int],
) -> bool:
    """Register ``watcher`` on ``target`` from the target's current state version (what
    ``head_of(key, agent_id)`` answers: the signal log owns the heads).

    Re-registering keeps the cursor as it is, ``updated_at`` included; an explicit watch
    upgrades an ambient one and an ambient registration never downgrades an explicit one.
    A different store path (or a legacy cursor with none) starts afresh: queued notices
    never carry over to another store.
    """
    target_key = parse_agent_key(target)
    if parse_agent_key(watcher) is None or target_key is None or watcher == target:
        return False
    existing = read_cursor(conn, watcher, target)
    if existing is None or existing.store_path != store_path:
        at = head_of(target, target_key.agent_id)
        if existing is not None and existing.provenance == PROVENANCE_EXPLICIT:
            provenance = PROVENANCE_EXPLICIT
        _write_fresh(
            conn,
            watcher=watcher,
            target=target,
            store_path=store_path,
            at=at,
            provenance=provenance,
            now=now,
        )
        return True
    if provenance == PROVENANCE_EXPLICIT and existing.provenance != PROVENANCE_EXPLICIT:
        conn.execute(  # a pending cursor keeps updated_at (refrozen_after)
            "UPDATE session_watch_cursors SET provenance = ?, updated_at = CASE WHEN"
            " material_sequence > last_seen_sequence THEN updated_at ELSE ? END"
            " WHERE watcher_session_key = ? AND target_session_key = ?",
            (PROVENANCE_EXPLICIT, now, watcher, target),
        )
    return True  # a re-registration that changes nothing leaves the cursor untouched


def seed_cursor(
    conn: Conn, *, watcher: str, target: str, store_path: str, at: int, now: int
) -> None:
    """A spawn edge: the parent watches the child from the spawn event on.

    An existing cursor with a notice pending keeps it; otherwise it moves to ``at``.
    """
    if parse_agent_key(watcher) is None or watcher == target:
        return
    existing = read_cursor(conn, watcher, target)
    if existing is not None and existing.store_path == store_path and existing.pending:
        # updated_at stays: a pending cursor frozen anew is how the gateway's start-up sweep
        # is told apart (refrozen_after)
        conn.execute(
            "UPDATE session_watch_cursors SET provenance = ?"
            " WHERE watcher_session_key = ? AND target_session_key = ?",
            (PROVENANCE_EXPLICIT, watcher, target),
        )
        return
    _write_fresh(
        conn,
        watcher=watcher,
        target=target,
        store_path=store_path,
        at=max(at, existing.last_seen if existing and existing.store_path == store_path else 0),
        provenance=PROVENANCE_EXPLICIT,
        now=now,
    )


def mark_opened(conn: Conn, watcher: str, target: str, notified: int) -> bool:
    """Record that this process opened the notice of ``watcher`` on ``target`` frozen at
    ``notified`` (one row per cursor: a newer notice replaces the older mark). True when the
    mark changed: a notice this sidecar had not marked as its own before."""
    written = conn.execute(  # the rows it wrote, not a RETURNING (9 µs more on SQLite)
        "INSERT INTO sessionwatch_opened_notices (watcher_session_key, target_session_key,"
        " notified_sequence) VALUES (?, ?, ?) ON CONFLICT (watcher_session_key,"
        " target_session_key) DO UPDATE SET notified_sequence = excluded.notified_sequence"
        " WHERE sessionwatch_opened_notices.notified_sequence <> excluded.notified_sequence",
        (watcher, target, notified),
    ).rowcount
    return written == 1


def advance_watchers(
    conn: Conn, *, target: str, sequence: int, actor_id: str | None, now: int
) -> list[Notice]:
    """A notifiable event at ``sequence``: raise ``material`` of every watcher that is behind,
    freeze ``notified`` where nothing was pending, and return the notices that opened now.

    Watchers are never told about events they caused; legacy cursors (no store path) wait
    until they are registered again.
    """
    params = (sequence, sequence, now, target, actor_id, sequence)
    if isinstance(conn, sqlite3.Connection):
        # SQLite (3.40) makes every change of a RETURNING statement and keeps its rows in
        # memory before it gives back the first: 57 µs for 10 watchers, where the update
        # alone and a read of the rows it left unmarked take 29. The rows it raised are
        # those whose material is now ``sequence``, a new event's: no cursor held it before.
        conn.execute(_ADVANCE, params)
        rows = conn.execute(_RAISED_UNMARKED, params[3:]).fetchall()
        moved = [WatchCursor.from_row(row) for row in rows]
    else:
        returning = f" RETURNING {_NOTICE_COLUMNS}, {_MARKED_HERE}"  # marked: the last
        rows = conn.execute(_ADVANCE + returning, params).fetchall()
        moved = [WatchCursor.from_row(row[:-1]) for row in rows if not row[-1]]
    # A notice that opens now (notified == sequence) is a new mark. One already pending
    # that this sidecar did not open (the gateway did, or an earlier sidecar that did not
    # mark) is marked too, and so becomes this sidecar's to wake: a change on its pair
    # reaches the gateway, and no pair stays behind a frozen notice nobody wakes. Either
    # way the mark changed; a notice already marked as ours is not opened again, and is
    # not written.
    if not moved:
        return []
    if len(moved) == 1:
        c = moved[0]
        return [c.notice()] if mark_opened(conn, c.watcher, c.target, c.notified) else []
    marked = _mark_all(conn, target, moved)
    return [c.notice() for c in moved if c.watcher in marked]


def _marked(cursor: str) -> str:
    """SQL: the pending notice of the cursor row named ``cursor`` carries this sidecar's
    mark."""
    return (
        "EXISTS (SELECT 1 FROM sessionwatch_opened_notices o"
        f" WHERE o.watcher_session_key = {cursor}.watcher_session_key"
        f" AND o.target_session_key = {cursor}.target_session_key"
        f" AND o.notified_sequence = {cursor}.notified_sequence)"
    )


_MARKED = _marked("c")  # in a query of session_watch_cursors c
_MARKED_HERE = _marked("session_watch_cursors")  # in an UPDATE's RETURNING
# The cursors an event on a target raises, bound as (target, actor): every agent's watch of
# it except its own actor's, and except those an earlier sidecar left without a store path.
# _ADVANCE raises those behind the event, bound as (sequence, sequence, now, target, actor,
# sequence); _RAISED_UNMARKED reads back those it raised that carry no mark of ours, bound
# as (target, actor, sequence).
_BEHIND = (
    f" WHERE target_session_key = ? AND {_QUALIFIED}"
    " AND watcher_store_path IS NOT NULL AND watcher_session_key IS DISTINCT FROM ?"
)
_ADVANCE = (
    "UPDATE session_watch_cursors SET"
    " notified_sequence = CASE WHEN notified_sequence <= last_seen_sequence"
    " THEN ? ELSE notified_sequence END,"
    " material_sequence = ?, updated_at = ?" + _BEHIND + " AND material_sequence < ?"
)
_RAISED_UNMARKED = (
    f"SELECT {_NOTICE_COLUMNS} FROM session_watch_cursors c"
    + _BEHIND
    + f" AND material_sequence = ? AND NOT {_MARKED}"
)
_MARKS_PER_STATEMENT = 500  # 1,500 parameters, far below SQLite's and PostgreSQL's limits


def _mark_all(conn: Conn, target: str, cursors: list[WatchCursor]) -> set[str]:
    """:func:`mark_opened` for every cursor of ``target`` at once: one statement (per
    500), not one per watcher. The watchers whose mark changed."""
    changed: set[str] = set()
    for at in range(0, len(cursors), _MARKS_PER_STATEMENT):
        part = cursors[at : at + _MARKS_PER_STATEMENT]
        rows = conn.execute(
            "INSERT INTO sessionwatch_opened_notices (watcher_session_key, target_session_key,"
            " notified_sequence) VALUES " + ", ".join(["(?, ?, ?)"] * len(part)) +
            " ON CONFLICT (watcher_session_key, target_session_key) DO UPDATE SET"
            " notified_sequence = excluded.notified_sequence"
            " WHERE sessionwatch_opened_notices.notified_sequence <> excluded.notified_sequence"
            " RETURNING watcher_session_key",
            [v for c in part for v in (c.watcher, target, c.notified)],
        ).fetchall()  # fmt: skip
        changed.update(str(r[0]) for r in rows)
    return changed


def list_pending(
    conn: Conn,
    *,
    watcher: str | None = None,
    store_path: str | None = None,
    opened_here: bool = False,
) -> list[WatchCursor]:
    """Cursors with a notice pending, optionally for one watcher (in one store, when
    ``store_path`` is given); with ``opened_here``, only the notices a sidecar opened."""
    sql = (
        f"SELECT {_NOTICE_COLUMNS} FROM session_watch_cursors c"
        f" WHERE material_sequence > last_seen_sequence AND {_QUALIFIED}"
        " AND watcher_store_path IS NOT NULL"
    )
    params: list[str] = []
    if watcher is not None:
        sql += " AND watcher_session_key = ?"
        params.append(watcher)
        if store_path is not None or not opened_here:
            sql += " AND watcher_store_path = ?"
            params.append(store_path or "")
    if opened_here:
        sql += " AND " + _MARKED
    rows = conn.execute(sql + " ORDER BY watcher_session_key, target_session_key", params)
    return [WatchCursor.from_row(row) for row in rows]


def acknowledge(conn: Conn, cursors: list[WatchCursor], now: int) -> list[Notice]:
    """Ack on drain (or on a wake the gateway accepted): ``last_seen := notified``; work that
    arrived after the freeze reopens exactly one fresh notice (``notified := material``),
    returned. A cursor that moved since it was read is left alone (compare-and-set). The
    work is the row's, not the cursor's as read: a wake is acknowledged after its call, and
    a turn recorded meanwhile must reopen its notice, never leave it unfrozen."""
    reopened: list[Notice] = []
    for c in cursors:
        seen = c.notified if c.notified > c.last_seen else c.material
        row = conn.execute(
            "UPDATE session_watch_cursors SET last_seen_sequence = ?, updated_at = ?"
            " WHERE watcher_session_key = ? AND target_session_key = ?"
            " AND last_seen_sequence = ? RETURNING material_sequence",
            (seen, now, c.watcher, c.target, c.last_seen),
        ).fetchone()
        if row is None:
            continue
        material = max(int(row[0]), c.material)
        conn.execute(
            "UPDATE session_watch_cursors SET notified_sequence = ?"
            " WHERE watcher_session_key = ? AND target_session_key = ?",
            (max(material, seen), c.watcher, c.target),
        )
        if material > seen:
            mark_opened(conn, c.watcher, c.target, material)
            reopened.append(
                Notice(
                    watcher=c.watcher,
                    store_path=c.store_path,
                    target=c.target,
                    last_seen=seen,
                    provenance=c.provenance,
                )
            )
    return reopened


def heal_unfrozen(conn: Conn) -> list[Notice]:
    """Startup sweep: a cursor with material work but no frozen watermark gets one (a notice
    this process opens, returned)."""
    rows = conn.execute(
        "UPDATE session_watch_cursors SET notified_sequence = material_sequence"
        " WHERE material_sequence > last_seen_sequence"
        " AND notified_sequence <= last_seen_sequence"
        f" RETURNING {_NOTICE_COLUMNS}"
    ).fetchall()
    healed = [WatchCursor.from_row(row) for row in rows]
    for c in healed:
        mark_opened(conn, c.watcher, c.target, c.notified)
    return [c.notice() for c in healed if parse_agent_key(c.watcher) and c.store_path]


def undecided_legacy(conn: Conn) -> int:
    """How many of the notices an upgrade could not attribute (see
    :func:`monitor.kernel.store.sqlite_schema.mark_legacy_notices`) are still pending and
    unmarked: at most the number the upgrade counted, fewer as pairs are taken over or
    drained. The count is kept up to date here, and dropped once it is zero."""
    counted = read_meta(conn, UNDECIDED_KEY)
    if counted is None:
        return 0
    row = conn.execute(
        "SELECT count(*) FROM session_watch_cursors c WHERE material_sequence >"
        " last_seen_sequence AND notified_sequence > last_seen_sequence AND NOT " + _MARKED
    ).fetchone()
    left = min(int(counted), int(row[0]) if row else 0)
    if left == 0:
        conn.execute("DELETE FROM sessionwatch_meta WHERE key = ?", (UNDECIDED_KEY,))
    elif left != int(counted):
        write_meta(conn, UNDECIDED_KEY, str(left))
    return left


def delete_watcher_cursors(conn: Conn, watcher: str) -> int:
    conn.execute(
        "DELETE FROM sessionwatch_opened_notices WHERE watcher_session_key = ?", (watcher,)
    )
    cur = conn.execute(
        "DELETE FROM session_watch_cursors WHERE watcher_session_key = ?", (watcher,)
    )
    return cur.rowcount


def delete_session_cursors(conn: Conn, key: str) -> int:
    conn.execute(
        "DELETE FROM sessionwatch_opened_notices"
        " WHERE watcher_session_key = ? OR target_session_key = ?",
        (key, key),
    )
    cur = conn.execute(
        "DELETE FROM session_watch_cursors WHERE watcher_session_key = ? OR target_session_key = ?",
        (key, key),
    )
    return cur.rowcount


def any_with_store_path(conn: Conn, path: str) -> bool:
    """Whether some cursor is stored under ``path`` (a read: opening writes only if so)."""
    row = conn.execute(
        "SELECT 1 FROM session_watch_cursors WHERE watcher_store_path = ? LIMIT 1", (path,)
    ).fetchone()
    return row is not None


def migrate_store_paths(conn: Conn, legacy: str, resolve: Callable[[str], str]) -> int:
    """Rewrite cursors stored under the placeholder ``legacy`` with the watcher's real path."""
    rows = conn.execute(
        "SELECT watcher_session_key, target_session_key FROM session_watch_cursors"
        " WHERE watcher_store_path = ?",
        (legacy,),
    ).fetchall()
    moved = 0
    for watcher, target in rows:
        path = resolve(watcher)
        if not path:
            continue
        conn.execute(
            "UPDATE session_watch_cursors SET watcher_store_path = ?"
            " WHERE watcher_session_key = ? AND target_session_key = ?",
            (path, watcher, target),
        )
        moved += 1
    return moved


def watcher_keys(conn: Conn) -> set[str]:
    """Every session that watches another."""
    return {
        r[0] for r in conn.execute("SELECT DISTINCT watcher_session_key FROM session_watch_cursors")
    }


def watched_targets(conn: Conn) -> set[str]:
    """Every session some watcher watches."""
    return {
        r[0] for r in conn.execute("SELECT DISTINCT target_session_key FROM session_watch_cursors")
    }


def delete_idle(conn: Conn, before: int) -> int:
    """Retention: cursors not touched since ``before`` go, and the marks of cursors gone."""
    deleted = conn.execute(
        "DELETE FROM session_watch_cursors WHERE updated_at < ?", (before,)
    ).rowcount
    conn.execute(
        "DELETE FROM sessionwatch_opened_notices WHERE NOT EXISTS (SELECT 1 FROM"
        " session_watch_cursors c WHERE c.watcher_session_key = sessionwatch_opened_notices"
        ".watcher_session_key AND c.target_session_key = sessionwatch_opened_notices"
        ".target_session_key)"
    )
    return int(deleted)


def progress(conn: Conn) -> tuple[int, int, int]:
    """How many cursors, and the sums of what they have seen and what they may see: moves
    with every watch, drain and acknowledgement."""
    row = conn.execute(
        "SELECT count(*), coalesce(sum(last_seen_sequence), 0),"
        " coalesce(sum(material_sequence), 0) FROM session_watch_cursors"
    ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)
