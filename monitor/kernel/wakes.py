"""The owner of ``sessionwatch_wakes``: the last wake call per watcher, claimed in the store
so that wake calls stay coalesced per watcher across every sidecar on a shared store."""

from __future__ import annotations

from monitor.kernel.conn import Conn


def claim(conn: Conn, watcher: str, *, now: int, window_ms: int) -> int | None:
    """Claim the wake of ``watcher`` at ``now``: None when it is ours to send, else the time
    of the wake someone sent within the window (the caller may try again when it ends)."""
    won = conn.execute(
        "INSERT INTO sessionwatch_wakes (watcher_session_key, woken_at) VALUES (?, ?)"
        " ON CONFLICT (watcher_session_key) DO UPDATE SET woken_at = excluded.woken_at"
        " WHERE sessionwatch_wakes.woken_at <= ? RETURNING woken_at",
        (watcher, now, now - window_ms),
    ).fetchone()
    if won is not None:
        return None
    row = conn.execute(
        "SELECT woken_at FROM sessionwatch_wakes WHERE watcher_session_key = ?", (watcher,)
    ).fetchone()
    return int(row[0]) if row else None
