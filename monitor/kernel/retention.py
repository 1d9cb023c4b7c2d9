"""Retention of the signal log: 30 days and 50,000 rows; idle cursors expire after 30 days.

Each session's ``pruned_max_sequence`` is stamped with the highest sequence about to be
deleted before anything is deleted, so a reader's history gap stays exact; heads never go down.
"""

from __future__ import annotations

from monitor.clock import DAY_MS, HOUR_MS
from monitor.errors import SessionwatchError
from monitor.kernel import cursors, outbox, signal_log
from monitor.kernel.store import sqlite_schema as schema
from monitor.lazylog import LazyLogger
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from monitor.clock import Clock
    from monitor.kernel.store.protocol import Conn

    Write = Callable[[Callable[[Conn], "PruneResult"]], Awaitable["PruneResult"]]

log = LazyLogger(__name__)

RETENTION_MS = 30 * DAY_MS
MAX_ROWS = 50_000
PRUNE_INTERVAL_MS = HOUR_MS
CURSOR_IDLE_MS = 30 * DAY_MS


class PruneResult(NamedTuple):
    deleted_events: int
    deleted_cursors: int
    stamped_sessions: int


def prune(
    conn: Conn,
    now: int,
    *,
    max_rows: int = MAX_ROWS,
    retention_ms: int = RETENTION_MS,
) -> PruneResult:
    """Run retention inside the caller's transaction."""
    stamped, deleted = signal_log.prune_events(
        conn, before=now - retention_ms, cap=signal_log.row_cap_sequence(conn, max_rows), now=now
    )
    idle = cursors.delete_idle(conn, now - CURSOR_IDLE_MS)
    outbox.prune(conn, now - outbox.KEEP_MS)
    schema.write_meta(conn, "last_prune_at", str(now))
    return PruneResult(deleted_events=deleted, deleted_cursors=idle, stamped_sessions=stamped)


def last_prune_at(conn: Conn) -> int:
    return int(schema.read_meta(conn, "last_prune_at") or 0)


class Retention:
    """When the log is pruned: at most once an hour (the last time is kept in the database),
    after a recording and from the running service's schedule, so that a log others write
    to (the gateway) is pruned too; a failure is said and waits for the next hour."""

    def __init__(self, write: Write, clock: Clock) -> None:
        """``write``: how a prune is committed (:meth:`Commits.write`)."""
        self.write = write
        self.clock = clock
        self.next_at = 0  # the kernel sets it from last_prune_at when it opens

    async def prune(self, now: int | None = None) -> PruneResult:
        at = self.clock() if now is None else now
        result = await self.write(lambda conn: prune(conn, at))
        self.next_at = at + PRUNE_INTERVAL_MS
        return result

    def due(self, at: int) -> bool:
        """Whether an hour has passed at ``at`` since the last prune (a caller on a hot
        path asks before it awaits :meth:`when_due`)."""
        return at >= self.next_at

    async def when_due(self, now: int | None = None) -> None:
        """Prune when an hour has passed since the last time."""
        at = self.clock() if now is None else now
        if not self.due(at):
            return
        self.next_at = at + PRUNE_INTERVAL_MS
        try:
            await self.prune(at)
        except SessionwatchError as exc:
            log.warning("retention failed: %s", exc)
