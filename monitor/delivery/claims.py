"""The owner of ``sessionwatch_wakes``: the last wake call per watcher and the notice it was
for, claimed in the store so that wake calls stay coalesced per watcher across every
sidecar on a shared store: one wake per notice, at most one per window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn


Claim = int | Literal["send", "done"]


def claim(conn: Conn, watcher: str, notice: str, *, now: int, window_ms: int) -> Claim:
    """Claim the wake of ``watcher`` for ``notice`` at ``now``: ``"send"`` when it is ours
    to send; ``"done"`` when someone already woke it for that notice; else the time of the
    wake someone sent within the window (one trailing wake may follow when it ends). A wake
    stored at a time after ``now`` (a wall clock stepped back since) holds no window: a
    window that would last until the clock caught up would stall every wake meanwhile."""
    row = conn.execute(
        "SELECT woken_at, notice FROM sessionwatch_wakes WHERE watcher_session_key = ?",
        (watcher,),
    ).fetchone()
    if row is not None and row[1] == notice:
        return "done"
    if row is not None and now - window_ms < int(row[0]) <= now:
        return int(row[0])
    conn.execute(
        "INSERT INTO sessionwatch_wakes (watcher_session_key, woken_at, notice) VALUES (?, ?, ?)"
        " ON CONFLICT (watcher_session_key) DO UPDATE SET woken_at = excluded.woken_at,"
        " notice = excluded.notice",
        (watcher, now, notice),
    )
    return "send"
