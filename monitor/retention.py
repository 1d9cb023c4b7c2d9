"""Retention of the signal log: 30 days and 50,000 rows; idle cursors expire after 30 days.

Each session's ``pruned_max_sequence`` is stamped with the highest sequence about to be
deleted before anything is deleted, so ``historyGap`` stays exact; heads never go down.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from monitor.clock import DAY_MS, HOUR_MS

RETENTION_MS = 30 * DAY_MS
MAX_ROWS = 50_000
PRUNE_INTERVAL_MS = HOUR_MS
CURSOR_IDLE_MS = 30 * DAY_MS


@dataclass(frozen=True, kw_only=True, slots=True)
class PruneResult:
    deleted_events: int
    deleted_cursors: int
    stamped_sessions: int

    def as_json(self) -> dict[str, int]:
        return {
            "deletedEvents": self.deleted_events,
            "deletedCursors": self.deleted_cursors,
            "stampedSessions": self.stamped_sessions,
        }


def _row_cap_sequence(conn: sqlite3.Connection, max_rows: int) -> int:
    """Rows with a sequence at or below this fall outside the newest ``max_rows``."""
    row = conn.execute(
        "SELECT sequence FROM session_state_events ORDER BY sequence DESC LIMIT 1 OFFSET ?",
        (max_rows,),
    ).fetchone()
    return int(row[0]) if row else 0


def prune(
    conn: sqlite3.Connection,
    now: int,
    *,
    max_rows: int = MAX_ROWS,
    retention_ms: int = RETENTION_MS,
) -> PruneResult:
    """Run retention inside the caller's transaction."""
    cutoff_time = now - retention_ms
    cap_seq = _row_cap_sequence(conn, max_rows)
    doomed = "(occurred_at < :cutoff OR sequence <= :cap)"
    params = {"cutoff": cutoff_time, "cap": cap_seq, "now": now}
    stamped = conn.execute(
        "INSERT INTO session_state_heads (session_key, agent_id, last_sequence,"
        " pruned_max_sequence, updated_at)"
        f" SELECT session_key, agent_id, max(sequence), max(sequence), :now"
        f" FROM session_state_events WHERE {doomed} GROUP BY session_key, agent_id"
        " ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " last_sequence = max(last_sequence, excluded.last_sequence),"
        " pruned_max_sequence = max(pruned_max_sequence, excluded.pruned_max_sequence)",
        params,
    ).rowcount
    deleted = conn.execute(f"DELETE FROM session_state_events WHERE {doomed}", params).rowcount
    cursors = conn.execute(
        "DELETE FROM session_watch_cursors WHERE updated_at < ?", (now - CURSOR_IDLE_MS,)
    ).rowcount
    conn.execute(
        "INSERT INTO sessionwatch_meta (key, value) VALUES ('last_prune_at', ?)"
        " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (str(now),),
    )
    return PruneResult(deleted_events=deleted, deleted_cursors=cursors, stamped_sessions=stamped)


def last_prune_at(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM sessionwatch_meta WHERE key = 'last_prune_at'").fetchone()
    return int(row[0]) if row else 0
