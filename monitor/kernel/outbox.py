"""The notice outbox: one row for every notice a sidecar opens, written in the transaction
that opens it (the transactional outbox). It is what wake delivery works from, and what
the readers of notices (``notices --follow``, the SSE stream, the status page) tail, so that
a notice acknowledged a moment after it opened is still seen.

A row names the notice: the watcher, the target and the sequence the watcher had seen
(``last_seen_sequence``, which the notice's text carries).
Its ``state`` is the wake's:

- ``wake``: the policy wakes the watcher and no call is in flight;
- ``queue``: the policy never wakes it (an ambient or a sub-agent watcher reads it on its
  own turn);
- ``sending``: a call carrying it may be in flight (set just before the call, inside the
  watcher's lease; one found with the lease expired was cut by a crash);
- ``woken``: the gateway accepted it (acknowledged in the same transaction);
- ``gone``: acknowledged or drained before it was woken.

``unanswered`` counts the calls that may have reached the gateway without an answer (a
timeout after the request went out, or a crash mid-call): each allows one more call, and at
:data:`MAX_UNANSWERED` the notice counts as delivered (see :mod:`monitor.delivery.ledger`).

A row is alive while its pair's cursor still has that notice pending: a drain or an
acknowledgement moves ``last_seen``, and the row is then dead whatever its state says.
"""

from __future__ import annotations

from monitor.kernel import cursors
from monitor.kernel.notices import Notice, notice_text
from monitor.kernel.policy import WatchPolicy
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

WAKE, QUEUE, SENDING, WOKEN, GONE = "wake", "queue", "sending", "woken", "gone"
MAX_UNANSWERED = 2  # the first call and one repeat may reach the gateway, never more
KEEP_MS = 60 * 60 * 1000  # settled rows stay an hour for the readers, then retention drops them

_COLUMNS = (
    "id, watcher_session_key, target_session_key, last_seen_sequence, state, unanswered, opened_at"
)


class OutboxRow(NamedTuple):
    """One outbox row: a notice and its wake's state."""

    id: int
    watcher: str
    target: str
    last_seen: int
    state: str
    unanswered: int
    opened_at: int = 0

    @property
    def text(self) -> str:
        return notice_text(self.target, self.last_seen)

    def woken_by_the_gateway(self, conn: Conn) -> bool:
        """Whether the gateway itself queued and woke this notice since it opened (its
        start-up sweep: :func:`monitor.kernel.cursors.refrozen_after`)."""
        return cursors.refrozen_after(
            conn, self.watcher, self.target, self.last_seen, self.opened_at
        )

    def alive(self, conn: Conn) -> cursors.WatchCursor | None:
        """The pair's cursor, while it still has this notice pending; else None."""
        c = cursors.read_cursor(conn, self.watcher, self.target)
        return c if c is not None and c.pending and c.last_seen == self.last_seen else None


def append(conn: Conn, notices: list[Notice], now: int) -> None:
    """Each notice that opened in this transaction, as a row of its own."""
    if not notices:
        return
    conn.executemany(
        "INSERT INTO sessionwatch_notice_outbox (watcher_session_key, target_session_key,"
        " last_seen_sequence, state, unanswered, opened_at, updated_at)"
        " VALUES (?, ?, ?, ?, 0, ?, ?)",
        [
            (n.watcher, n.target, n.last_seen, WAKE if WatchPolicy.wakes(n) else QUEUE, now, now)
            for n in notices
        ],
    )


def acknowledge(conn: Conn, pending: list[cursors.WatchCursor], now: int) -> list[Notice]:
    """:func:`monitor.kernel.cursors.acknowledge` (a drain, or a wake the gateway
    accepted), with the notices it reopens in the outbox."""
    reopened = cursors.acknowledge(conn, pending, now)
    append(conn, reopened, now)
    return reopened


def due(conn: Conn, watcher: str, now: int) -> list[OutboxRow]:
    """The watcher's live rows to wake (``wake``, or ``sending`` left by a call that was
    cut), oldest first; its dead ones are marked ``gone`` on the way."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM sessionwatch_notice_outbox WHERE watcher_session_key = ?"
        " AND state IN ('wake', 'sending') ORDER BY id",
        (watcher,),
    ).fetchall()
    entries = [OutboxRow(*row) for row in rows]
    alive = [e for e in entries if e.alive(conn) is not None]
    for e in entries:
        if e not in alive:
            set_state(conn, e.id, GONE, now)
    return alive


def watchers_due(conn: Conn) -> list[str]:
    """Every watcher with a row to wake (some may turn out dead when claimed)."""
    rows = conn.execute(
        "SELECT DISTINCT watcher_session_key FROM sessionwatch_notice_outbox"
        " WHERE state IN ('wake', 'sending') ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows]


def read(conn: Conn, entry_id: int) -> OutboxRow | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM sessionwatch_notice_outbox WHERE id = ?", (entry_id,)
    ).fetchone()
    return OutboxRow(*row) if row else None


def set_state(
    conn: Conn, entry_id: int, state: str, now: int, *, unanswered: int | None = None
) -> None:
    conn.execute(
        "UPDATE sessionwatch_notice_outbox SET state = ?, updated_at = ?,"
        " unanswered = coalesce(?, unanswered) WHERE id = ?",
        (state, now, unanswered, entry_id),
    )


def last_id(conn: Conn) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM sessionwatch_notice_outbox").fetchone()
    return int(row[0]) if row else 0


def opened_since(conn: Conn, watcher: str, after: int) -> list[OutboxRow]:
    """The watcher's rows after id ``after``, whatever became of them: what a reader that
    follows the watcher's notices has not seen yet."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM sessionwatch_notice_outbox WHERE watcher_session_key = ?"
        " AND id > ? ORDER BY id",
        (watcher, after),
    ).fetchall()
    return [OutboxRow(*row) for row in rows]


def prune(conn: Conn, before: int) -> int:
    """Retention: rows last changed before ``before`` that are no longer to be woken; a row
    still to be woken is marked ``gone`` by the claim that finds its notice acknowledged."""
    deleted = conn.execute(
        "DELETE FROM sessionwatch_notice_outbox WHERE updated_at < ?"
        " AND state NOT IN ('wake', 'sending')",
        (before,),
    ).rowcount
    return int(deleted)
